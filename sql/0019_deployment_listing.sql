-- ListDeployments pages an app's or an environment's deployments newest first: each page is a
-- range of one of these indexes, in listing order, instead of a sort of all of them.
-- Never edit this file once applied: later changes go in a new numbered file.
ALTER TABLE deployments
  ADD KEY deployments_app_listing (app_id, created_at, id),
  ADD KEY deployments_environment_listing (environment_id, created_at, id);
