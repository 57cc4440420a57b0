"""The fake Nomad's Variables and their locks, held to what Nomad documents.

Expected values come from Nomad's documentation, quoted where each is used:
``api-docs/variables/variables.mdx`` (https://developer.hashicorp.com/nomad/api-docs/variables/
variables), ``api-docs/variables/locks.mdx`` (…/api-docs/variables/locks), ``docs/concepts/
variables.mdx`` (…/docs/concepts/variables), ``commands/var/lock.mdx`` (…/commands/var/lock),
``other-specifications/acl-policy.mdx`` (…/docs/other-specifications/acl-policy); and, for what
those leave out about Variables (not locks), Nomad 1.6.5's ``command/agent/
variable_endpoint.go`` and ``nomad/state/state_store_variables.go``. Requests go through plain
``requests`` over loopback HTTP; time is passed in, never slept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from gpuledger.sim.nomad_api import FakeNomad
from tests.fakes.nomad_acl import AclAccess

NODE = "0f6b5a3e-9a7c-4c1e-8d2b-7e4f1a2b3c4d"
ACTOR = "nomad/jobs/gpuledger-fleet/actor"
UNKNOWN_SECRET = "6f1c0d2e-1111-4a2b-8c3d-4e5f6a7b8c9d"  # noqa: S105 - no token of the fake


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeNomad]:
    with FakeNomad(NODE) as nomad:
        nomad.variables.clock = clock
        yield nomad


def put(
    fake: FakeNomad,
    path: str,
    body: dict[str, Any] | None = None,
    query: str = "",
    token: str | None = None,
    method: str = "PUT",
) -> requests.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    url = f"{fake.url}/v1/var/{path}{'?' + query if query else ''}"
    return requests.request(method, url, data=data, headers=headers, timeout=5)


def get(fake: FakeNomad, target: str, token: str | None = None) -> requests.Response:
    headers = {"X-Nomad-Token": token} if token else {}
    return requests.get(f"{fake.url}{target}", headers=headers, timeout=5)


def acquire(
    fake: FakeNomad, ttl: str = "15s", delay: str = "30s", **items: str
) -> requests.Response:
    body = {"Path": ACTOR, "Items": items, "Lock": {"TTL": ttl, "LockDelay": delay}}
    return put(fake, ACTOR, body, "lock-acquire")


def with_id(lock_id: str, **extra: Any) -> dict[str, Any]:
    return {"Path": ACTOR, "Lock": {"ID": lock_id}, **extra}


# --------------------------------------------------------------------------- locks


def test_a_lock_is_renewed_then_lost_at_its_ttl_and_taken_by_another_after_its_delay(
    fake: FakeNomad, clock: Clock
) -> None:
    first = acquire(fake, holder="a")
    # locks.mdx: "The response body returns the created or updated variable including the lock
    # parameters and ID, along with metadata created by the server".
    assert first.status_code == 200
    held = first.json()
    a_id = held["Lock"]["ID"]
    assert held["Lock"]["TTL"] == "15s" and held["Lock"]["LockDelay"] == "30s"
    assert held["Items"] == {"holder": "a"} and held["Path"] == ACTOR
    assert first.headers["X-Nomad-Index"] == str(held["ModifyIndex"])
    assert fake.variables.holder(ACTOR) == a_id

    # locks.mdx: "In the case of attempting to acquire a variable that is already locked, a
    # conflict response will be returned." (409 and the conflicting variable.)
    refused = acquire(fake, holder="b")
    assert refused.status_code == 409
    assert refused.json()["Path"] == ACTOR and refused.json()["Lock"] is None

    # locks.mdx: "A valid call to lock renew needs to be placed before the lock's TTL is up …
    # The response body only returns metadata created by the server and the lock parameters".
    clock.now += 10
    renewed = put(fake, ACTOR, with_id(a_id), "lock-renew")
    assert renewed.status_code == 200
    assert renewed.json()["Lock"] == {"TTL": "15s", "LockDelay": "30s", "ID": a_id}
    assert "Items" not in renewed.json()

    clock.now += 14.9  # 24.9 s after acquiring, 14.9 s after renewing: still A's
    assert acquire(fake, holder="b").status_code == 409
    assert fake.variables.holder(ACTOR) == a_id

    # concepts/variables.mdx: "If by the time the TTL expires, and no renew or release calls
    # were made, the variable will remain locked for at least the lock delay duration".
    clock.now += 0.2  # 15.1 s after the renewal: the TTL is up
    assert fake.variables.holder(ACTOR) is None
    assert put(fake, ACTOR, with_id(a_id), "lock-renew").status_code == 409
    assert acquire(fake, holder="b").status_code == 409
    clock.now += 29.8  # 29.9 s into the 30 s delay
    assert acquire(fake, holder="b").status_code == 409
    clock.now += 0.1  # TTL (15 s) + delay (30 s) after the renewal
    taken = acquire(fake, holder="b")
    assert taken.status_code == 200
    b_id = taken.json()["Lock"]["ID"]
    assert b_id != a_id and taken.json()["Items"] == {"holder": "b"}

    # locks.mdx: "lock-release … will immediately remove the lock over the variable, making it
    # modifiable without restrictions again"; its sample answer has neither Items nor Lock.
    released = put(fake, ACTOR, with_id(b_id), "lock-release")
    assert released.status_code == 200
    assert "Lock" not in released.json() and "Items" not in released.json()
    assert fake.variables.holder(ACTOR) is None
    assert acquire(fake, holder="a").status_code == 200  # no delay after a release


def test_a_locked_variable_is_read_by_all_and_written_only_with_its_lock_id(
    fake: FakeNomad,
) -> None:
    lock_id = acquire(fake, holder="a").json()["Lock"]["ID"]
    # concepts/variables.mdx: "Once a variable is locked, it can be read by everyone, but it
    # can only be updated by the lock holder." locks.mdx: "an attempt to … modify a locked
    # variable without the correct ID … will return HTTP error code 409".
    assert put(fake, ACTOR, {"Items": {"holder": "b"}}).status_code == 409
    wrong = with_id("not-the-id", Items={"holder": "b"})
    assert put(fake, ACTOR, wrong).status_code == 409
    # locks.mdx: "The variable items can be updated at any time using the lock ID".
    written = put(fake, ACTOR, with_id(lock_id, Items={"holder": "a", "day": "2026-12-03"}))
    assert written.status_code == 200
    assert written.json()["Items"] == {"holder": "a", "day": "2026-12-03"}
    assert written.json()["Lock"]["ID"] == lock_id
    # locks.mdx: "the lock parameters are unmmutable, attempting to modify them while a lock is
    # present will generate an error."
    changed = {"Path": ACTOR, "Items": {"x": "y"}, "Lock": {"ID": lock_id, "TTL": "1m"}}
    assert put(fake, ACTOR, changed).status_code == 400
    assert put(fake, ACTOR, method="DELETE").status_code == 409
    read = get(fake, f"/v1/var/{ACTOR}")
    assert read.status_code == 200 and read.json()["Items"]["holder"] == "a"
    assert "ID" not in read.json()["Lock"]  # the fake keeps the ID to its holder
    assert fake.variables.holder(ACTOR) == lock_id


def test_a_release_needs_the_lock_id_and_no_items(fake: FakeNomad) -> None:
    lock_id = acquire(fake).json()["Lock"]["ID"]
    # locks.mdx: "if the request body contains any item, it will generate a bad request
    # response."
    with_items = with_id(lock_id, Items={"a": "b"})
    assert put(fake, ACTOR, with_items, "lock-release").status_code == 400
    assert put(fake, ACTOR, with_id("someone-else"), "lock-release").status_code == 409
    assert fake.variables.holder(ACTOR) == lock_id


@pytest.mark.parametrize(
    ("ttl", "delay", "status"),
    [("10s", "24h", 200), ("9s", "15s", 400), ("15s", "24h0m1s", 400), ("1m30s", "10s", 200)],
)
def test_lock_ttl_and_delay_lie_between_ten_seconds_and_a_day(
    fake: FakeNomad, ttl: str, delay: str, status: int
) -> None:
    # locks.mdx: "The lock TTL and Delay must be values between 10 seconds and 24 hours."
    assert acquire(fake, ttl, delay).status_code == status


def test_a_lock_without_ttl_or_delay_takes_the_var_lock_defaults(fake: FakeNomad) -> None:
    # var lock.mdx: "ttl: … Defaults to 15s." and "delay: … Defaults to 15s."
    answer = put(fake, ACTOR, {"Path": ACTOR, "Lock": {}}, "lock-acquire")
    assert answer.status_code == 200
    assert answer.json()["Lock"]["TTL"] == "15s" and answer.json()["Lock"]["LockDelay"] == "15s"
    # locks.mdx: "locked variables can be created with or without any itmes."
    assert answer.json()["Items"] == {}


def test_the_knobs_expire_and_steal_a_lock(fake: FakeNomad, clock: Clock) -> None:
    a_id = acquire(fake, delay="20s").json()["Lock"]["ID"]
    fake.variables.expire(ACTOR)
    assert fake.variables.holder(ACTOR) is None
    assert acquire(fake).status_code == 409  # the delay, from the expiry
    clock.now += 20
    assert acquire(fake).status_code == 200
    stolen = fake.variables.steal(ACTOR)
    assert fake.variables.holder(ACTOR) == stolen != a_id
    assert put(fake, ACTOR, with_id(a_id), "lock-renew").status_code == 409


def test_the_next_requests_can_be_made_to_fail(fake: FakeNomad) -> None:
    fake.variables.fail_next(2)
    assert [get(fake, "/v1/vars").status_code for _ in range(3)] == [500, 500, 200]


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[]", b'{"Lock": "15s"}', b'{"Lock": {"TTL": 15}}', b'{"Items": [1]}']
)
def test_a_hostile_body_is_a_bad_request_not_a_crash(fake: FakeNomad, raw: bytes) -> None:
    url = f"{fake.url}/v1/var/{ACTOR}?lock-acquire"
    answer = requests.put(url, data=raw, timeout=5)
    assert answer.status_code == 400 and answer.text


# --------------------------------------------------------------------------- variables


def test_a_missing_variable_is_a_404(fake: FakeNomad) -> None:
    # variable_endpoint.go (1.6.5): CodedError(http.StatusNotFound, "variable not found").
    answer = get(fake, "/v1/var/nomad/jobs/nothing-here")
    assert (answer.status_code, answer.text) == (404, "variable not found")


def test_check_and_set_writes_only_over_the_index_it_names(fake: FakeNomad) -> None:
    audit = "nomad/jobs/gpuledger-fleet/audit/2026-12-03"
    body = {"Path": audit, "Items": {"actions": "0"}}
    # variables.mdx: "If the cas value is 0, the variable is only created if it does not
    # already exist."
    created = put(fake, audit, body, "cas=0")
    assert created.status_code == 200
    index = created.json()["ModifyIndex"]
    assert created.json()["CreateIndex"] == index
    again = put(fake, audit, {**body, "Items": {"actions": "9"}}, "cas=0")
    # variables.mdx: "In the case of a compare-and-set conflict, the API will return HTTP error
    # code 409 and a response body showing the conflicting variable."
    assert again.status_code == 409
    assert again.json()["Items"] == {"actions": "0"} and again.json()["ModifyIndex"] == index
    assert (
        put(fake, audit, {**body, "Items": {"actions": "1"}}, f"cas={index + 7}").status_code == 409
    )
    updated = put(fake, audit, {**body, "Items": {"actions": "1"}}, f"cas={index}")
    assert updated.status_code == 200 and updated.json()["ModifyIndex"] > index
    assert updated.json()["CreateIndex"] == index
    # state_store_variables.go (1.6.5): a CAS on an absent variable conflicts with a zero one.
    absent = put(fake, "nomad/jobs/none", {"Items": {"a": "b"}}, "cas=3")
    assert absent.status_code == 409
    assert absent.json()["ModifyIndex"] == 0 and absent.json()["Items"] is None


def test_a_write_needs_items_and_a_valid_path(fake: FakeNomad) -> None:
    # variable_endpoint.go (1.6.5): "variable missing required Items object".
    answer = put(fake, ACTOR, {"Path": ACTOR})
    assert (answer.status_code, answer.text) == (400, "variable missing required Items object")
    # variables.mdx: "The following regex matches the allowed paths: ^[a-zA-Z0-9-_~/]{1,128}$".
    assert put(fake, "a.b", {"Items": {"a": "b"}}).status_code == 500
    assert put(fake, ACTOR, {"Items": {"a": "b"}}, "cas=x").status_code == 400


def test_delete_checks_and_sets_and_answers_no_content(fake: FakeNomad) -> None:
    index = put(fake, ACTOR, {"Items": {"a": "b"}}).json()["ModifyIndex"]
    # variables.mdx: "the variable will only be deleted if the cas value matches".
    assert put(fake, ACTOR, query=f"cas={index + 1}", method="DELETE").status_code == 409
    # variable_endpoint.go (1.6.5): resp.WriteHeader(http.StatusNoContent).
    deleted = put(fake, ACTOR, query=f"cas={index}", method="DELETE")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert get(fake, f"/v1/var/{ACTOR}").status_code == 404


def test_the_list_shows_metadata_under_a_prefix(fake: FakeNomad) -> None:
    for path in ("nomad/jobs/a", "nomad/jobs/b", "other/c"):
        put(fake, path, {"Items": {"secret": "s"}})
    answer = get(fake, "/v1/vars?prefix=nomad/jobs/")
    # variables.mdx: "Note this API returns only variable metadata without decrypting the
    # variable body."
    assert answer.status_code == 200
    assert [v["Path"] for v in answer.json()] == ["nomad/jobs/a", "nomad/jobs/b"]
    assert all("Items" not in v for v in answer.json())
    assert get(fake, "/v1/vars?namespace=prod").json() == []


# --------------------------------------------------------------------------- ACLs


def acls(fake: FakeNomad, rules: str) -> str:
    access = AclAccess()
    fake.access = access
    access.apply_policy("fleet", rules)
    return access.create_token("fleet", ["fleet"]).secret


FLEET = """
namespace "default" {
  variables {
    path "nomad/jobs/gpuledger-fleet/*" { capabilities = ["write", "read"] }
    path "nomad/jobs/gpuledger-fleet/audit/*" { capabilities = ["write"] }
  }
}
"""


def test_a_token_may_lock_only_where_it_may_write(fake: FakeNomad) -> None:
    token = acls(fake, FLEET)
    # var lock.mdx: "this command requires the 'variables:write' capability for the
    # destination namespace and path."
    body = {"Lock": {"TTL": "15s"}}
    assert put(fake, ACTOR, body, "lock-acquire", token=token).status_code == 200
    refused = put(fake, "other/lock", body, "lock-acquire", token=token)
    assert (refused.status_code, refused.text) == (403, "Permission denied")
    # variables.mdx: Delete needs "namespace:* variables:destroy".
    assert put(fake, ACTOR, token=token, method="DELETE").status_code == 403
    assert put(fake, ACTOR, body, "lock-acquire", token=UNKNOWN_SECRET).status_code == 403


def test_a_conflict_hides_items_from_a_token_that_may_not_read(fake: FakeNomad) -> None:
    token = acls(fake, FLEET)
    audit = "nomad/jobs/gpuledger-fleet/audit/2026-12-03"
    assert put(fake, audit, {"Items": {"n": "1"}}, "cas=0", token=token).status_code == 200
    # variables.mdx: "If the provided ACL token does not also have read permissions to the
    # variable path, the response will include only metadata and not the Items field".
    again = put(fake, audit, {"Items": {"n": "2"}}, "cas=0", token=token)
    assert again.status_code == 409 and again.json()["Items"] is None
    # acl-policy.mdx: write "Includes the 'list' capability but not the 'read'".
    assert get(fake, f"/v1/var/{audit}", token=token).status_code == 403
    assert [v["Path"] for v in get(fake, "/v1/vars", token=token).json()] == [audit]


def test_a_workload_reads_its_own_job_variables(fake: FakeNomad) -> None:
    access = AclAccess()
    fake.access = access
    admin = access.create_token("admin", management=True).secret
    put(fake, "nomad/jobs/gpuledger-fleet", {"Items": {"a": "b"}}, token=admin)
    identity = access.issue_identity("default", "gpuledger-fleet", "controller", "run")
    # concepts/variables.mdx: "The workload identity for each task grants it automatic read and
    # list access to Variables found at Nomad-owned paths with the prefix nomad/jobs/".
    assert get(fake, "/v1/var/nomad/jobs/gpuledger-fleet", token=identity).status_code == 200
    assert put(fake, ACTOR, {"Items": {"a": "b"}}, token=identity).status_code == 403


# --------------------------------------------------------------------------- versions


def test_before_1_7_a_lock_acquire_is_a_plain_write(fake: FakeNomad) -> None:
    fake.version = "1.6.5"
    # variable_endpoint.go (1.6.5) reads only "cas" from the query, and its VariableMetadata
    # has no Lock: the request is an upsert, which needs Items.
    first = acquire(fake, holder="a")
    assert first.status_code == 200 and "Lock" not in first.json()
    assert acquire(fake, holder="b").status_code == 200
    assert fake.variables.holder(ACTOR) is None
    assert put(fake, ACTOR, {"Lock": {"TTL": "15s"}}, "lock-acquire").status_code == 400


def test_before_1_7_a_conflict_answers_the_variable_without_a_lock_field(fake: FakeNomad) -> None:
    # nomad/structs/variables.go (1.6.5): VariableDecrypted is VariableMetadata (Namespace,
    # Path, CreateIndex, CreateTime, ModifyIndex, ModifyTime) and Items, no Lock.
    fake.version = "1.6.5"
    body = {"Path": ACTOR, "Items": {"holder": "a"}}
    assert put(fake, ACTOR, body, "cas=0").status_code == 200
    conflict = put(fake, ACTOR, {**body, "Items": {"holder": "b"}}, "cas=0")
    assert conflict.status_code == 409
    assert set(conflict.json()) == {
        "Namespace", "Path", "CreateIndex", "CreateTime", "ModifyIndex", "ModifyTime", "Items"
    }  # fmt: skip
    assert conflict.json()["Items"] == {"holder": "a"}
    fake.version = "1.7.0"
    assert put(fake, ACTOR, body, "cas=0").json()["Lock"] is None  # the locks page's sample


def test_before_1_4_there_are_no_variables(fake: FakeNomad) -> None:
    fake.version = "1.3.16"
    answer = get(fake, f"/v1/var/{ACTOR}")
    assert (answer.status_code, answer.text) == (404, "404 page not found")
