"""The Slurm backend: Slurm allocates and runs ADC's trainers, ADC decides (deploy/slurm/README.md).

- `commands.py`: Slurm's own tools (sbatch, scancel, squeue, sinfo, scontrol), argv lists only;
- `state.py`: what Slurm says of a job and a node, read from its `--json` output;
- `inventory.py`: the devices a node offers ADC, from Slurm (drained nodes and foreign jobs' GPUs left out);
- `trainer.py`: one trainer attempt as a Slurm batch job (submit, follow, checkpoint-stop, cancel);
- `batch.py`: the batch job itself, run by slurmd as the team's uid: the worker's launch in a sandbox it
  builds without root (a user namespace), Slurm's signals turned into the trainer's stop request;
- `backend.py`: the worker backend that puts these together.
"""
