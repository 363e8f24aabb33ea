-- 0016: webhook hosts name the ports beside 80 and 443 that URLs on them
-- may use (an allowed host is not a port scanner).
ALTER TABLE runlease_webhook_hosts
    ADD COLUMN ports integer[] NOT NULL DEFAULT '{}'
        CHECK (cardinality(ports) <= 16 AND 1 <= ALL (ports) AND 65535 >= ALL (ports));
