#!/usr/bin/env node
// Validates Kubernetes objects with the upstream schemas of the `kubernetes-models` package.
//
//   node tools/schema/validate.mjs [--yaml] [FILE...]     (no FILE: standard input)
//
// Input: JSON (one object or an array of objects), or with --yaml YAML documents (each an object;
// empty documents are skipped). Each object is checked with the kubernetes-models class of its
// apiVersion and kind, for the groups Krane uses: core, apps, policy, autoscaling,
// networking.k8s.io, rbac.authorization.k8s.io and coordination.k8s.io. An object of any other
// kind is a violation.
//
// On top of the class's own validation (types, required fields, enums, formats), a field the
// schema does not know is a violation. The API server would drop such a field without a word,
// which is exactly how a generated field gets lost. The package's validators are compiled code
// without the schemas, so unknown fields are found by watching them: every object is handed to
// the validator behind a Proxy that records which properties it reads; a property of an object
// that the validator never looked at is unknown to the schema (maps, such as labels, are
// enumerated by the validator and so count as known).
//
// Prints every violation on its own line, "<Kind> <namespace>/<name>: <path>: <message>", then
// a summary. Exit status: 0 all valid, 1 violations, 2 the input could not be read.

import { readFileSync } from "node:fs";

const GROUPS = new Set([
  "",
  "apps",
  "policy",
  "autoscaling",
  "networking.k8s.io",
  "rbac.authorization.k8s.io",
  "coordination.k8s.io",
]);

function fail(message) {
  process.stderr.write(`validate: ${message}\n`);
  process.exit(2);
}

async function loadYaml() {
  try {
    return await import("yaml");
  } catch (e) {
    fail(`the yaml package is not installed (run ./dev setup): ${e.message}`);
  }
}

async function readInputs(files, yamlMode) {
  const sources = files.length ? files : ["-"];
  const objects = [];
  for (const file of sources) {
    const text = readFileSync(file === "-" ? 0 : file, "utf8");
    const where = file === "-" ? "standard input" : file;
    if (yamlMode) {
      const YAML = await loadYaml();
      const docs = YAML.parseAllDocuments(text);
      docs.forEach((doc, i) => {
        if (doc.errors.length) fail(`${where}: document ${i + 1}: ${doc.errors[0].message}`);
        const value = doc.toJS();
        if (value !== null && value !== undefined) objects.push({ where: `${where}#${i + 1}`, value });
      });
    } else {
      let value;
      try {
        value = JSON.parse(text);
      } catch (e) {
        fail(`${where}: not valid JSON: ${e.message}`);
      }
      const list = Array.isArray(value) ? value : [value];
      list.forEach((v, i) => objects.push({ where: `${where}[${i}]`, value: v }));
    }
  }
  return objects;
}

// "/spec/template/spec/containers/0/image" -> "spec.template.spec.containers[0].image"
function pathOf(segments) {
  let out = "";
  for (const s of segments) {
    if (/^\d+$/.test(s)) out += `[${s}]`;
    else out += out ? `.${s}` : s;
  }
  return out || "(the object)";
}

function instancePathToPath(p) {
  return pathOf(
    p
      .split("/")
      .slice(1)
      .map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~")),
  );
}

// A copy of `value` whose objects record the properties read (`reads`) and whether their keys
// were enumerated (`enumerated`), keyed by path.
function watched(value, segments, seen) {
  if (Array.isArray(value)) return value.map((v, i) => watched(v, [...segments, String(i)], seen));
  if (value === null || typeof value !== "object") return value;
  const target = {};
  for (const [k, v] of Object.entries(value)) target[k] = watched(v, [...segments, k], seen);
  const entry = { segments, keys: Object.keys(value), reads: new Set(), enumerated: false };
  seen.push(entry);
  return new Proxy(target, {
    get(t, key, receiver) {
      if (typeof key === "string") entry.reads.add(key);
      return Reflect.get(t, key, receiver);
    },
    has(t, key) {
      if (typeof key === "string") entry.reads.add(key);
      return Reflect.has(t, key);
    },
    ownKeys(t) {
      entry.enumerated = true;
      return Reflect.ownKeys(t);
    },
  });
}

function schemaModule(group, version, kind) {
  const g = group === "" ? "Core" : group.split(".")[0].replace(/^./, (c) => c.toUpperCase());
  const v = version.replace(/^./, (c) => c.toUpperCase());
  return `kubernetes-models/_schemas/IoK8sApi${g}${v}${kind}`;
}

async function violationsOf(object) {
  if (object === null || typeof object !== "object" || Array.isArray(object)) {
    return ["(the object): must be an object"];
  }
  const apiVersion = object.apiVersion;
  const kind = object.kind;
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !apiVersion || !kind) {
    return ["apiVersion and kind: required"];
  }
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
  if (!GROUPS.has(group) || !/^[A-Za-z0-9]+$/.test(kind) || !/^v[0-9a-z]+$/.test(version)) {
    return [`${apiVersion} ${kind}: not a kind this validator knows (groups: core, ${[...GROUPS].filter(Boolean).join(", ")})`];
  }
  let Model;
  let schema;
  try {
    const modelPath = group === "" ? `kubernetes-models/${version}/${kind}` : `kubernetes-models/${group}/${version}/${kind}`;
    Model = (await import(modelPath))[kind];
    schema = await import(schemaModule(group, version, kind));
  } catch (e) {
    if (e && e.code === "ERR_MODULE_NOT_FOUND" && /kubernetes-models['"]? /.test(e.message)) {
      fail(`the kubernetes-models package is not installed (run ./dev setup): ${e.message}`);
    }
    return [`${apiVersion} ${kind}: no such kind in kubernetes-models`];
  }
  if (!Model || Model.apiVersion !== apiVersion || Model.kind !== kind) {
    return [`${apiVersion} ${kind}: no such kind in kubernetes-models`];
  }

  const out = [];
  // The class's own validation.
  try {
    new Model(object).validate();
  } catch (e) {
    if (!Array.isArray(e.errors)) throw e;
    for (const err of e.errors) {
      let path = instancePathToPath(err.instancePath);
      let message = err.message || err.keyword;
      if (err.keyword === "required") {
        path = `${err.instancePath}/${err.params.missingProperty}`;
        path = instancePathToPath(path);
        message = "required";
      }
      if (err.keyword === "enum") message += `: ${JSON.stringify(err.params.allowedValues)}`;
      out.push(`${path}: ${message}`);
    }
  }
  // Fields the schema does not know.
  const seen = [];
  schema.validate(watched(object, [], seen));
  for (const entry of seen) {
    if (entry.enumerated) continue;
    for (const key of entry.keys) {
      if (!entry.reads.has(key)) out.push(`${pathOf([...entry.segments, key])}: unknown field`);
    }
  }
  return [...new Set(out)];
}

function describe(object) {
  const kind = (object && object.kind) || "(no kind)";
  const meta = (object && object.metadata) || {};
  const name = meta.name || "(no name)";
  return meta.namespace ? `${kind} ${meta.namespace}/${name}` : `${kind} ${name}`;
}

const args = process.argv.slice(2);
const yamlMode = args.includes("--yaml");
const files = args.filter((a) => a !== "--yaml");
if (files.some((f) => f.startsWith("--"))) fail(`unknown option; usage: validate.mjs [--yaml] [FILE...]`);

const inputs = await readInputs(files, yamlMode);
let violations = 0;
for (const { where, value } of inputs) {
  for (const v of await violationsOf(value)) {
    violations++;
    console.log(`${describe(value)}: ${v}  (${where})`);
  }
}
console.log(`validate: ${inputs.length} objects, ${violations} violations`);
process.exit(violations ? 1 : 0);
