"""Project macros: every Krane target goes through one of these so common flags live in one place."""

KRANE_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Werror=return-type",
    "-Werror=switch",
]

def krane_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = KRANE_COPTS + copts, **kwargs)

def krane_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = KRANE_COPTS + copts, **kwargs)

def krane_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A Catch2 test; `main` comes from //tests/support:catch_main (JUnit XML, --test_filter)."""
    native.cc_test(
        name = name,
        copts = KRANE_COPTS + copts,
        size = size,
        deps = deps + ["//tests/support:catch_main"],
        **kwargs
    )

def krane_plugin(name, srcs = [], deps = [], copts = [], **kwargs):
    """A plugin shared object `lib<name>.so` loaded with dlopen.

    Symbols are hidden by default (only the ABI entry point is exported); heavy libraries are
    linked dynamically so one process holds one copy of their global state.
    """
    native.cc_binary(
        name = "lib" + name + ".so",
        srcs = srcs,
        deps = deps,
        copts = KRANE_COPTS + ["-fvisibility=hidden", "-fvisibility-inlines-hidden"] + copts,
        linkshared = True,
        linkstatic = False,
        **kwargs
    )

def krane_proto_library(name, src, deps = [], grpc = False, visibility = None):
    """C++ (and optionally gRPC) code for one .proto file under //proto.

    `src` is relative to the proto/ folder, e.g. "krane/cluster/v1/state.proto"; `deps` are other
    krane_proto_library targets whose files it imports. Generated headers are included as
    "krane/cluster/v1/state.pb.h". protoc and grpc_cpp_plugin come from Debian.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.filegroup(
        name = name + "_proto_srcs",
        srcs = [src] + [d + "_proto_srcs" for d in deps],
        visibility = visibility,
    )
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR)/proto --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    native.genrule(
        name = name + "_codegen",
        srcs = [name + "_proto_srcs"],
        outs = outs,
        cmd = "/usr/bin/protoc -Iproto --cpp_out=$(GENDIR)/proto {grpc} proto/{src}".format(
            grpc = grpc_flags,
            src = src,
        ),
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc++"] if grpc else []),
        visibility = visibility,
    )
