-- 0016: a placeholder. The number belongs to another issue's migration,
-- merged separately; this empty file only lets branch issue-27 (whose
-- migration is 0017) migrate without a gap. At merge, take the other
-- branch's 0016 and drop this file.
SELECT 1;
