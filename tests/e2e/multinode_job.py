"""A tiny GRPO run across two simulated machines, as docs/multinode.md sets one up; prints a JSON report.

    python tests/e2e/multinode_job.py MODEL_DIR DATA_DIR RUN_DIR

`ray.cluster_utils.Cluster` starts a head and a second node on this machine, each with its own 2 CPUs and a
custom resource naming it (`machine0`, `machine1`); the driver joins through `trainer.ray_address`, with
`trainer.nnodes=2`, `trainer.n_gpus_per_node=1`, `trainer.device=cpu`. The report says where each rank ran
and what a pool asking for more machines than the cluster has gets. tests/e2e/test_multinode.py runs it in
its own process because the cluster replaces the test session's local Ray.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's hybridrl, not an installed one


def main(model_dir: Path, data_dir: Path, run_dir: Path) -> dict:
    import ray
    from ray.cluster_utils import Cluster
    from test_e2e_runs import overrides, train_metrics

    from hybridrl.config.loader import load_config
    from hybridrl.controller import RayResourcePool
    from hybridrl.trainer.launch import run_ppo

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"machine0": 1}})
    cluster.add_node(num_cpus=2, resources={"machine1": 1})
    cluster.wait_for_nodes()
    try:
        cfg = load_config(overrides=overrides(model_dir, data_dir, run_dir, "trainer.nnodes=2",
                                              "trainer.n_gpus_per_node=1", f"trainer.ray_address={cluster.address}",
                                              "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                                              "trainer.total_training_steps=2", "trainer.logger=[console]"))
        summary = run_ppo(cfg)
        machines = {n["NodeID"]: sorted(r for r in n["Resources"] if r.startswith("machine"))
                    for n in ray.nodes() if n["Alive"]}
        too_many = RayResourcePool([1, 1, 1], use_gpu=False, name_prefix="three_machines", placement_timeout_s=3)
        try:
            too_many.get_placement_groups()
            refusal = None
        except ValueError as e:
            refusal = str(e)
        steps = [{k: h[k] for k in ("training/global_step", "actor/pg_loss", "critic/score/mean")}
                 for h in train_metrics(summary["history"])]
        return {"placement": summary["placement"]["actor_rollout"], "machines": machines, "steps": steps,
                "three_machines": refusal}
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    report = main(*map(Path, sys.argv[1:4]))
    print("MULTINODE_REPORT " + json.dumps(report))
