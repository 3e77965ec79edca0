"""Test sessions. `nox` runs them all (what CI runs); `nox -s tests` is the quick one.

tests: the newest torch pip resolves (2.14.1 here) with every optional engine that installs beside it.
ipex:  torch 2.8.* with intel-extension-for-pytorch 2.8.*, our tested minimum: the IPEX tests for real,
       plus the rest of the suite.
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
    session.run("pytest", "-q", *session.posargs)
