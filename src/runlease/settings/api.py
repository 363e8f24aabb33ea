"""`runlease api`'s settings."""

from __future__ import annotations

from dataclasses import dataclass

from runlease.errors import SettingsError
from runlease.settings.mechanism import describe, setting


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """`runlease api`: the HTTP control plane."""

    database_url: str | None = setting(
        None, "PostgreSQL URL.", env=("DATABASE_URL",))
    database_url_file: str | None = setting(
        None, "A file holding the PostgreSQL URL (a mounted Secret): unlike --database-url, "
              "on no command line, which every process of the machine can read.")
    listen_database_url: str | None = setting(
        None, "Separate URL for the LISTEN session that follows event streams; defaults "
              "to database_url.")
    prepared_statements: bool = setting(True, "Server-side prepared statements.")
    host: str = setting("127.0.0.1", "Address to listen on.")
    port: int = setting(8080, "Port to listen on.", minimum=0, maximum=65535)
    tokens: str | None = setting(
        None, "Tenant tokens as tenant=token pairs, comma-separated; a token may be given "
              "as sha256:<hex> so the secret itself is not in the configuration.")
    admin_tokens: tuple[str, ...] = setting(
        (), "Admin tokens (comma-separated; sha256:<hex> allowed).")
    tokens_file: str | None = setting(
        None, "A file of tokens, one per line: `<tenant> <token>` or `admin <token>`; "
              "# starts a comment.")
    stream_token_secret: str | None = setting(
        None, "Key that signs short-lived event-stream tokens; set the same on every "
              "replica (a random one is made at start otherwise).")
    stream_token_ttl_s: int = setting(300, "Lifetime of an event-stream token.", minimum=10,
                                      maximum=86_400)
    resume_secret: str | None = setting(
        None, "Key that signs the single-use resume links of runs waiting for input "
              "(GET /v1/runs/{id}/input); without it, a key made once and kept in the "
              "database signs them (the same for every replica, across restarts).")
    public_url: str | None = setting(
        None, "The API's address as people reach it (https://runs.example.com), for the "
              "resume links; defaults to the address each request came to.")
    console_secret: str | None = setting(
        None, "Key that signs the web console's session cookies (/ui/); set the same on "
              "every replica (a random one is made at start otherwise, and a restart signs "
              "everyone out).")
    console_session_s: int = setting(8 * 3600, "Lifetime of a web console sign-in.",
                                     minimum=60, maximum=30 * 86_400)
    cors_origins: tuple[str, ...] = setting(
        (), "Origins allowed by CORS (comma-separated), for browsers on other origins.")
    max_request_bytes: int = setting(1024 * 1024, "Largest request body accepted.",
                                     minimum=1024, maximum=64 * 1024 * 1024)
    max_batch_request_bytes: int = setting(
        16 * 1024 * 1024, "Largest body of a batch submit (POST /v1/runs/batch, up to 1,000 "
                          "runs).", minimum=1024, maximum=256 * 1024 * 1024)
    max_input_bytes: int = setting(256 * 1024, "Largest run input (JSON) accepted.",
                                   minimum=2, maximum=16 * 1024 * 1024)
    sse_keepalive_s: float = setting(15.0, "Seconds between keepalive comments on an idle "
                                           "event stream.", minimum=0.1)
    sse_poll_s: float = setting(1.0, "While the LISTEN session is down, event streams "
                                     "poll this often (all runs in one read).", minimum=0.05)
    sse_max_streams_per_tenant: int = setting(
        200, "Event streams one tenant may hold open on one API process; a stream past it "
             "is refused with 429, so one tenant cannot take the process's streams from "
             "the others.", minimum=1, maximum=100_000)
    request_header_timeout_s: float = setting(
        10.0, "Seconds a request's line and headers may take to arrive; a slower "
              "connection is closed (slowloris).", minimum=0.1, maximum=300.0)
    log_json: bool = setting(False, "Log one JSON object per line.")

    def check(self) -> None:
        if self.max_input_bytes > self.max_request_bytes:
            raise SettingsError(f"{describe('max_input_bytes')} must not exceed "
                                "max_request_bytes")
