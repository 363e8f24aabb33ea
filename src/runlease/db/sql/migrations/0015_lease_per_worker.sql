-- Placeholder on branch issue-32b only: 0015 is the lead's core v2
-- (0015_lease_per_worker.sql on main); the merge takes main's file whole.
SELECT 1;
