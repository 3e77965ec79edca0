"""The conventions of the `accel` command: --version, help and a default on every option, torchrun's spellings."""
import argparse

import pytest

import accel
from accel.cli import build_parser, main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_version_prints_accels_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"accel {accel.__version__}"


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_option_of_every_command_says_what_it_is_and_its_default(command):
    parser = subcommands()[command]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"accel {command} {action.dest}: no help text"
        shown = parser.formatter_class("accel")._get_help_string(action)
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            assert "(default: %(default)s)" in shown, f"accel {command} {action.dest}: its default is not shown"
    assert parser.description is None or "\n" not in parser.description.strip()  # one line, not an essay


def test_launch_takes_torchruns_spellings():
    parser = build_parser()
    ours = parser.parse_args(["launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                              "node0", "--master-port", "29501", "--max-restarts", "3", "train.py", "--lr", "1"])
    theirs = parser.parse_args(["launch", "--nproc_per_node=2", "--nnodes=2", "--node_rank", "1", "--master_addr",
                                "node0", "--master_port=29501", "--max_restarts", "3", "train.py", "--lr", "1"])
    assert vars(ours) == vars(theirs)
    assert (ours.nproc_per_node, ours.node_rank, ours.script_args) == (2, 1, ["--lr", "1"])
