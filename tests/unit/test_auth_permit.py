"""The request's :class:`~souq.auth.access.Permit` and the two rules that ask it: who gets an
app's secrets in a machine it makes (``skips_secrets``) and who sees a job's env values
(``shown``), with real tokens of one cluster key."""

from __future__ import annotations

from souq.auth.access import Permit, permit_of
from souq.auth.tokens import Scope, Verifier, generate_key, mint, narrow, public_key_from_text
from souq.auth.tokens import public_key_text as public_text
from souq.broker.sched_routes import REDACTED, shown
from souq.broker.secret_routes import skips_secrets
from souq.jobs.core import new_job
from souq.model.job import JobSubmit

KEY = generate_key()
PUBLIC = public_key_from_text(public_text(KEY))
VERIFIER = Verifier(PUBLIC)


def permit(scope: Scope, app: str = "web") -> Permit:
    token, grant = mint(KEY, app=app, scope=scope)
    return Permit(VERIFIER, f"Bearer {token}", grant)


def test_only_a_token_that_may_read_the_secrets_makes_a_machine_that_gets_them() -> None:
    assert skips_secrets(permit(Scope.WRITE), "web", asked=False)
    assert not skips_secrets(permit(Scope.DEPLOY), "web", asked=False)
    assert not skips_secrets(permit(Scope.ADMIN, "*"), "web", asked=False)
    assert skips_secrets(permit(Scope.DEPLOY), "web", asked=True)  # Fly's skip_secrets
    # A deploy token narrowed to write is a write token, whatever its first block says.
    deploy, grant = mint(KEY, app="web", scope=Scope.DEPLOY)
    narrowed = Permit(VERIFIER, f"Bearer {narrow(deploy, PUBLIC, scope=Scope.WRITE)}", grant)
    assert skips_secrets(narrowed, "web", asked=False)
    # Without auth (no verifier) every machine gets them.
    assert not skips_secrets(permit_of(None), "web", asked=False)


def test_a_jobs_env_values_reach_its_workers_and_deployers_only() -> None:
    spec = JobSubmit(name="j", command="true", app="web", env={"DB_PASSWORD": "pw"})
    job = new_job(spec, 1_000)
    for scope in (Scope.READ, Scope.WRITE):
        assert shown(job, permit(scope)).spec.env == {"DB_PASSWORD": REDACTED}
    for scope in (Scope.QUEUE, Scope.DEPLOY):
        assert shown(job, permit(scope)).spec.env == {"DB_PASSWORD": "pw"}
    assert shown(job, permit(Scope.QUEUE, "db")).spec.env == {"DB_PASSWORD": REDACTED}
    assert job.spec.env == {"DB_PASSWORD": "pw"}  # the record itself is untouched
