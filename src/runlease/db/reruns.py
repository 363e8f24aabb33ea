"""Reruns (statements in sql/reruns.sql, issue 28): retry the last steps of
a long run without paying for the first ones again.

    rerun   any run -> a new pending run of its tenant, pool and thread
            (and key), linked by rerun_of, with its input or a new one; the
            steps the old run committed before `from_step` are copied as
            committed, so the new run's agent replays them, running none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from runlease.core import bounds
from runlease.db.executor import Conn
from runlease.db.keys import KeyStore
from runlease.db.models import Run
from runlease.db.runs import NewRun
from runlease.db.threads import ThreadStore

MAX_RERUNS_LISTED = 50


class RerunStore(KeyStore, ThreadStore):
    async def rerun(self, run_id: UUID, *, conn: Conn, tenant_id: str | None = None,
                    from_step: str | None = None,
                    input: Mapping[str, Any] | None = None,  # noqa: A002
                    ) -> tuple[Run, int]:
        """In the caller's transaction (on `conn`, its submit slot): the new
        run and how many steps were copied. RunNotFound for another
        tenant's run, as for a missing one."""
        old = await self.get(run_id, tenant_id=tenant_id, conn=conn)
        if from_step is not None:
            bounds.check_step_key(from_step)
        new = NewRun(old.tenant_id, dict(input) if input is not None else old.input_json,
                     old.priority, old.max_attempts, old.budget_json or None,
                     labels=old.labels or None)
        if old.thread_id is not None:
            joined = await self.submit_to_thread(old.pool, new, old.thread_id, conn=conn)
            run = joined.result.run
        else:
            (result,) = await self.enqueue_many(old.pool, [new], notify=False, conn=conn)
            run = result.run
            if old.concurrency_key is not None:
                run = await self.join_key(run.id, old.concurrency_key, conn=conn)
        rows = await self._rows("run_rerun_copy_steps", {
            "old": old.id, "id": run.id, "from_step": from_step}, conn)
        copied = int(rows[0]["copied"])
        await self._rows("run_rerun_link", {"old": old.id, "id": run.id, "copied": copied},
                         conn)
        return await self.get(run.id, conn=conn), copied

    async def reruns_of(self, run_id: UUID, *, conn: Conn | None = None) -> list[UUID]:
        rows = await self._rows("run_reruns_of", {"id": run_id, "limit": MAX_RERUNS_LISTED},
                                conn)
        return [r["id"] for r in rows]
