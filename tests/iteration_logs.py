"""The iteration logs that hold the solvers' behaviour still while their modules move.

Each case solves one problem through the public API and returns its log: per iteration the
cost, the gradient's max norm, the step's norm and the linear solver's iterations. The logs in
``tests/data/iteration_logs.json`` were recorded by this file at the commit it names, before
``solvers/`` was restructured; ``tests/test_iteration_logs.py`` holds every later commit to them.

    python tests/iteration_logs.py --record          # rewrite the recorded logs (all cases)
    python tests/iteration_logs.py CASE [CASE ...]   # print the logs of some cases as JSON

The two-device case runs on PoCL's ``POCL_DEVICES="pthread pthread"`` and the MPI case under
``mpirun -n 2``, each in a process of its own, through this file's ``--child`` entry.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORDED = os.path.join(HERE, "data", "iteration_logs.json")
if HERE not in sys.path:
    sys.path.insert(0, HERE)

BAL = ("problem-16-22106-pre", "problem-21-11315-pre", "problem-39-18060-pre",
       "problem-49-7776-pre", "problem-73-11032-pre")
LINEAR_SOLVERS = ("sparse_schur", "iterative_schur")
# Tolerances as bench_colmap's (Ceres' and pycolmap's defaults but for the iteration cap).
TOLERANCES = dict(function_tolerance=1e-6, gradient_tolerance=1e-10, parameter_tolerance=1e-8)


def log(result):
    """The columns the logs are held to."""
    h = result.history
    return {"cost": [s.cost for s in h], "gradient_max_norm": [s.gradient_max_norm for s in h],
            "step_norm": [s.step_norm for s in h],
            "linear_solver_iterations": [int(s.linear_solver_iterations) for s in h],
            "final_cost": float(result.final_cost), "termination_type": result.termination_type,
            "state": result.state}


def _bal(name, linear_solver, **options):
    import solvers
    from bal_data import bal_file
    p = solvers.read_bal(str(bal_file(name)))
    return log(solvers.bundle_adjust(p, linear_solver=linear_solver, max_iterations=20, handle_sigint=False,
                                     **options))


def colmap_model(n_images, folder):
    """bench_colmap's synthetic reconstruction (a SIMPLE_RADIAL camera per image, tracks of 8,
    60 points per image, pycolmap's noise), written to ``folder`` and read back by ours."""
    import pycolmap
    from solvers import colmap
    pycolmap.set_random_seed(0)
    o = pycolmap.SyntheticDatasetOptions(
        num_rigs=n_images, num_cameras_per_rig=1, num_frames_per_rig=1, num_points3D=60 * n_images,
        track_length=8, num_points2D_without_point3D=0,
        camera_model_id=pycolmap.CameraModelId.SIMPLE_RADIAL, camera_params=[1280.0, 512.0, 384.0, 0.05])
    rec = pycolmap.synthesize_dataset(o)
    pycolmap.synthesize_noise(pycolmap.SyntheticNoiseOptions(
        point2D_stddev=1.0, point3D_stddev=0.02, rig_from_world_translation_stddev=0.01,
        rig_from_world_rotation_stddev=0.2), rec)
    rec.write(folder)
    return colmap.read_model(folder)


def _colmap(n_images):
    import solvers
    from solvers import colmap
    with tempfile.TemporaryDirectory() as tmp:
        model = colmap_model(n_images, tmp)
    prob = colmap.problem_from_reconstruction(model)
    return log(solvers.solve(prob, linear_solver="sparse_schur", max_iterations=50, handle_sigint=False,
                             **TOLERANCES))


def _general():
    import solvers
    from test_solver_problem import scene, three_group_problem
    prob = three_group_problem(scene(seed=3, n_images=8, n_cameras=3, n_points=60), loss="huber")
    return log(solvers.solve(prob, linear_solver="sparse_schur", max_iterations=30, handle_sigint=False))


def _child(case):
    """Runs in the process that has the two devices or the MPI ranks; prints the log as JSON."""
    import solvers
    from bal_data import bal_file
    p = solvers.read_bal(str(bal_file("problem-21-11315-pre")))
    kw = dict(linear_solver="iterative_schur", max_iterations=12, handle_sigint=False)
    if case == "split-two-devices":
        import clkernels
        by_platform = {}
        for d in clkernels.list_devices():
            by_platform.setdefault(d.platform.int_ptr, []).append(d)
        pair = next(ds for ds in by_platform.values() if len(ds) >= 2)[:2]
        out = log(solvers.bundle_adjust(p, devices=pair, **kw))
    else:
        from mpi4py import MPI
        out = log(solvers.bundle_adjust(p, comm=MPI.COMM_WORLD, **kw))
        if MPI.COMM_WORLD.Get_rank() != 0:
            return
    print(json.dumps(out))


def _in_child(case):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYCLAD_DEVICE", None)
    cmd = [sys.executable, "-W", "ignore", os.path.abspath(__file__), "--child", case]
    if case == "split-two-devices":
        env["POCL_DEVICES"] = "pthread pthread"
    else:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            raise RuntimeError("the MPI case needs Open MPI's mpirun (apt-get install openmpi-bin) and mpi4py")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = [mpirun, "-n", "2"] + cmd
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"{case} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def cases():
    """Every case's name and the function that returns its log."""
    out = {f"bal-{n}-{ls}": (lambda n=n, ls=ls: _bal(n, ls)) for n in BAL for ls in LINEAR_SOLVERS}
    # The host reference path too, which the device paths are tested against.
    out.update({f"bal-host-problem-49-7776-pre-{ls}": (lambda ls=ls: _bal("problem-49-7776-pre", ls,
                                                                           device_resident=False))
                for ls in LINEAR_SOLVERS})
    out["colmap-30"] = lambda: _colmap(30)
    out["colmap-300"] = lambda: _colmap(300)
    out["general-three-groups"] = _general
    out["split-two-devices"] = lambda: _in_child("split-two-devices")
    out["mpi-two-ranks"] = lambda: _in_child("mpi-two-ranks")
    return out


def main(argv):
    if argv[:1] == ["--child"]:
        _child(argv[1])
        return
    table = cases()
    if argv[:1] == ["--record"]:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        logs = {}
        for name, run in table.items():
            print(name, flush=True)
            logs[name] = run()
        with open(RECORDED, "w") as f:
            json.dump({"commit": commit, "logs": logs}, f, indent=1)
            f.write("\n")
        return
    print(json.dumps({name: table[name]() for name in argv}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
