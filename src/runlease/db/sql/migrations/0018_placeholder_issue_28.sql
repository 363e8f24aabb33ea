-- A placeholder for issue 28's migration 0018 (the lead's), so that this
-- branch's 0019 applies (migrate.py wants numbers without gaps). Drop this
-- file when merging: the real 0018 takes its number.
SELECT 1;
