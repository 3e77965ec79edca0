"""Test sessions. `nox` runs them all (what CI runs); `nox -s tests` is the quick one.

tests: the newest torch pip resolves (2.15.0 on 2026-11-22) with every optional engine that installs beside it;
       the preservation zoo draws 1,000 cases (tests/test_equivalence.py).
ipex:  torch 2.8.* with intel-extension-for-pytorch 2.8.*, our tested minimum: the IPEX tests for real,
       plus the rest of the suite (the zoo with 200 cases: the main session draws the 1,000).
"""
import nox

nox.options.sessions = ["tests", "ipex"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session):
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "not ipex", *session.posargs)


@nox.session
def ipex(session):
    # One resolver run, so nothing in .[test] can lift torch past 2.8 (IPEX 2.8 exits on any other torch).
    session.install("torch==2.8.*", "torchvision==0.23.*", "intel-extension-for-pytorch==2.8.*", "-e", ".[test]")
    session.run("python", "-c", "from accel.hardware import ipex_problem as p; assert p() is None, p()")
    session.run("pytest", "-q", *session.posargs, env={"ACCEL_ZOO_EXAMPLES": "200"})
