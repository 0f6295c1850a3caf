"""Flow control over MCP: batonq_schedule, debounce on batonq_enqueue, and
settings and schedules in batonq_queues, a paused queue's claims, and a
task's group with the limits it counts against."""

from __future__ import annotations

from tests.mcp_server.support import call, make_key, refused, stdio_session

import batonq


async def test_schedule_tool_and_settings_in_queues(admin_dsn: str) -> None:
    async with stdio_session(admin_dsn) as session:
        added = await call(session, "batonq_schedule", action="add", name="nightly", cron="30 2 * * *",
                           queue="reports", payload={"k": 1}, tz="Europe/Berlin")  # fmt: skip
        added = added["schedule"]
        assert (added["queue"], added["tz"], added["paused"]) == ("reports", "Europe/Berlin", False)
        paused = await call(session, "batonq_schedule", action="pause", name="nightly")
        assert paused["schedule"]["paused"] is True
        listed = await call(session, "batonq_queues")
        assert [s["name"] for s in listed["schedules"]] == ["nightly"]
        [settings] = [q for q in listed["settings"] if q["name"] == "reports"]
        assert (settings["paused"], settings["lease_s"]) == (False, 300)
        message = await refused(session, "batonq_schedule", action="add", name="bad", cron="often", queue="q")
        assert "invalid_argument: invalid cron expression 'often'" in message
        await call(session, "batonq_schedule", action="remove", name="nightly")
        assert (await call(session, "batonq_queues"))["schedules"] == []


async def test_a_worker_key_may_not_add_schedules(admin_dsn: str) -> None:
    async with stdio_session(admin_dsn, "--key", make_key(admin_dsn, 2)) as session:
        args = {"action": "add", "name": "x", "cron": "* * * * *", "queue": "q"}
        message = await refused(session, "batonq_schedule", **args)
        assert message.endswith("forbidden: add of a schedule needs a key of ring 0 (admin) or stronger")


async def test_another_queues_schedule_is_not_shown_to_exist(admin: batonq.Client, admin_dsn: str) -> None:
    admin.add_schedule("hidden", "0 * * * *", "private:q")
    async with stdio_session(admin_dsn, "--key", make_key(admin_dsn, 0, "shop:*")) as session:
        for action in ("pause", "resume", "remove"):
            message = await refused(session, "batonq_schedule", action=action, name="hidden")
            assert "schedule hidden does not exist" in message and "private" not in message
        # A name outside the key's scopes is refused whether it is taken or not.
        for name in ("hidden", "free"):
            args = {"action": "add", "name": name, "cron": "* * * * *", "queue": "shop:q"}
            message = await refused(session, "batonq_schedule", **args)
            assert message.endswith(f"forbidden: this key may not name a schedule '{name}'")
    assert [s.queue for s in admin.schedules()] == ["private:q"]


async def test_debounced_enqueue(admin_dsn: str) -> None:
    async with stdio_session(admin_dsn) as session:
        args = {"queue": "digest", "debounce_key": "user-7", "debounce_s": 60}
        first = await call(session, "batonq_enqueue", payload={"n": 1}, **args)
        second = await call(session, "batonq_enqueue", payload={"n": 2}, keep="first", **args)
        assert (second["created"], second["task_id"]) == (False, first["task_id"])
        [task] = (await call(session, "batonq_tasks", queue="digest"))["tasks"]
        assert task["payload"] == {"n": 1}


async def test_claim_gets_nothing_from_a_paused_queue(admin_dsn: str) -> None:
    async with stdio_session(admin_dsn) as session:
        await call(session, "batonq_enqueue", queue="paused", payload={"n": 1})
        with batonq.connect(admin_dsn) as admin:
            admin.pause("paused")
            assert (await call(session, "batonq_claim", queue="paused", wait_s=1))["task"] is None
            admin.resume("paused")
        assert (await call(session, "batonq_claim", queue="paused"))["task"]["row"] == {"n": 1}


async def test_a_group_on_enqueue_and_the_limits_in_queues(admin_dsn: str) -> None:
    with batonq.connect(admin_dsn) as admin:
        admin.configure_queue(
            "exports", group_max_leased=1, rate_limit=50, group_rate_limit=20, rate_period_s=10
        )
    async with stdio_session(admin_dsn) as session:
        made = await call(session, "batonq_enqueue", queue="exports", payload={"n": 1}, group="acme")
        ran = await call(session, "batonq_run", queue="exports", payload={"n": 2}, group="acme")
        assert ran["group"] == "acme"
        listed = await call(session, "batonq_tasks", queue="exports")
        assert {t["task_id"]: t["group"] for t in listed["tasks"]} == dict.fromkeys(
            [made["task_id"], ran["task_id"]], "acme"
        )
        claimed = (await call(session, "batonq_claim", queue="exports"))["task"]
        assert (claimed["task_id"], claimed["group"]) == (made["task_id"], "acme")
        assert (await call(session, "batonq_claim", queue="exports"))["task"] is None  # acme is full
        [settings] = [q for q in (await call(session, "batonq_queues"))["settings"] if q["name"] == "exports"]
        names = ("max_leased", "group_max_leased", "rate_limit", "group_rate_limit", "rate_period_s")
        limits = {k: settings[k] for k in names}
        assert limits == {
            "max_leased": None, "group_max_leased": 1, "rate_limit": 50,
            "group_rate_limit": 20, "rate_period_s": 10,
        }  # fmt: skip
        message = await refused(session, "batonq_enqueue", queue="exports", payload={}, group="")
        assert "group" in message
