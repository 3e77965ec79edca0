#!/bin/bash
# Chapter 11 with MPI and no scheduler: mpirun starts every rank on the hosts given; accel's ddp accelerator
# reads OMPI_COMM_WORLD_* (Open MPI) or PMI_RANK/PMI_SIZE (Intel MPI, MPICH). Run from the repository root,
# on the first host, with the repository at the same path on every host:
#     examples/cluster/ch11_mpirun.sh host1,host2            # 2 ranks per host
#     PPN=4 examples/cluster/ch11_mpirun.sh host1,host2 --epochs 10
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 host1,host2[,...] [ch11_multi_node.py arguments]" >&2
    exit 2
fi
HOSTS=$1; shift
PPN=${PPN:-2}
NHOSTS=$(echo "$HOSTS" | tr ',' '\n' | wc -l)
export MASTER_ADDR=${MASTER_ADDR:-$(echo "$HOSTS" | cut -d, -f1)}
export MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / PPN ))}

if mpirun --version 2>&1 | grep -q "Open MPI"; then
    # Open MPI: -x exports a variable to every rank; --map-by/--bind-to give each rank its own cores.
    exec mpirun -np $(( NHOSTS * PPN )) --host "$(echo "$HOSTS" | sed "s/\(,\|$\)/:$PPN\1/g")" \
        --map-by "ppr:$PPN:node:PE=$OMP_NUM_THREADS" --bind-to core \
        -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS -x PATH -x PYTHONPATH \
        python examples/ch11_multi_node.py "$@"
else
    # Intel MPI / MPICH (hydra): -ppn ranks per node, -genv exports a variable.
    exec mpirun -n $(( NHOSTS * PPN )) -ppn "$PPN" -hosts "$HOSTS" \
        -genv MASTER_ADDR "$MASTER_ADDR" -genv MASTER_PORT "$MASTER_PORT" -genv OMP_NUM_THREADS "$OMP_NUM_THREADS" \
        python examples/ch11_multi_node.py "$@"
fi
