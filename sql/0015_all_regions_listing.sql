-- An index in the listing order of all regions, so that the API's listing of every region reads
-- each page straight from it instead of sorting all the remaining rows of the table for every
-- page (0014 only served the listing of one region).
-- Never edit this file once applied: later changes go in a new numbered file.
--
-- Listing order is (type, region, id). The tables of one type list all regions in
-- (region, id) order, which their keys from 0014 already serve.
ALTER TABLE resources
  ADD KEY resources_type_list (type, region_id, id);
