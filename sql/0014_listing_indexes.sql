-- Indexes in listing order, so that a full sync (and the API's listings of one region) reads
-- each page straight from an index instead of sorting every remaining row of the region for
-- every page: a region of 100,000 resources took 50 pages, each sorting up to 100,000 rows.
-- Never edit this file once applied: later changes go in a new numbered file.
--
-- Listing order is (type, region, id); within one region that is (type, id), and for a table of
-- one type (region, id).
ALTER TABLE resources
  ADD KEY resources_region_list (region_id, type, id);

ALTER TABLE sentinels
  ADD KEY sentinels_region_list (region_id, id);

ALTER TABLE cilium_network_policies
  ADD KEY cilium_network_policies_region_list (region_id, id);

ALTER TABLE deployment_topology
  ADD KEY deployment_topology_region_list (region_id, deployment_id);
