"""Chapter 11: training with multiple machines. One script for every rank of a multi-node DDP job, whatever
started it: `accel launch`/torchrun on each node, `mpirun` (Open MPI, Intel MPI, MPICH) or SLURM's `srun`.
accel's `ddp` accelerator reads the launcher's variables, joins the process group (gloo on CPUs, NCCL on GPUs)
and shards the loader; rank 0 prints the table. Ready-made job files are in examples/cluster/:

    sbatch examples/cluster/ch11_torchrun.sbatch     # SLURM: accel launch (torchrun) on each node
    sbatch examples/cluster/ch11_srun.sbatch         # SLURM: srun starts every rank itself
    examples/cluster/ch11_mpirun.sh host1,host2      # Open MPI / Intel MPI, no scheduler
    # two "nodes" on this machine, to rehearse (loopback):
    accel launch --nnodes 2 --node-rank 0 --master-port 29511 --cores-per-proc 1 examples/ch11_multi_node.py &
    accel launch --nnodes 2 --node-rank 1 --master-port 29511 --cores-per-proc 1 examples/ch11_multi_node.py

Started without a launcher it explains how to start it and exits 0.
"""
from __future__ import annotations

from ch09_ddp_cpu import worker
from common import missing, parser, print_table


def main(argv=None) -> int:
    args_parser = parser(__doc__.splitlines()[0])
    args_parser.add_argument("--epochs", type=int, default=3)
    args_parser.add_argument("--batch-size", type=int, default=64, help="global batch (split across all ranks)")
    args_parser.add_argument("--device", default="auto", help="auto = cuda when there are GPUs, else cpu")
    args_parser.add_argument("--plan", default=None,
                             help='JSON plan for every rank (default ["threads", "ddp"] on CPU, ["amp", "ddp"] on GPU)')
    args = args_parser.parse_args(argv)
    import torch

    from accel.hardware.launcher import launcher_environment

    gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    args.plan = args.plan or ('["amp", "ddp"]' if gpu else '["threads", "ddp"]')
    launch = launcher_environment()
    if launch is None:
        return missing("chapter 11 is a multi-node job: no launcher started this process (no RANK/WORLD_SIZE from "
                       "accel launch or torchrun, OMPI_COMM_WORLD_*, PMI_* or SLURM_PROCID/SLURM_NTASKS)",
                       "Start it on every node with one of the files in examples/cluster/ (see this file's "
                       "docstring), or rehearse two nodes on this machine:\n" + __doc__.split("loopback):\n")[1]
                       .split("\n\n")[0])
    result = worker(args, device=args.device)
    if result is not None:  # rank 0
        result["variant"] = f"{result['nodes']} node(s) x {launch.local_world_size} process(es)"
        print_table(f"Multi-node DDP ({result['launcher']}), the book's CNN on real digits, global batch "
                    f"{args.batch_size}",
                    [("variant", "job", "s"), ("device", "device", "s"), ("ddp", "ddp", "s"),
                     ("seconds", "train s", ".2f"), ("step_ms", "ms/step", ".1f"),
                     ("samples_per_s", "samples/s", ".0f"), ("accuracy", "test acc", ".3f")],
                    [result], json_out=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
