"""Imports stay light: a process pays for scipy, Mako, tqdm, torch or pycolmap only on a path that
uses them. Each check is a fresh interpreter, reading its real sys.modules."""
import json
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("scipy", "mako", "tqdm", "torch", "pycolmap", "matplotlib", "cv2")


def _loaded(code: str, env=None):
    script = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))
    """)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=path, **(env or {})))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_importing_the_packages_loads_nothing_heavy():
    assert _loaded("import solvers, clkernels, pyclad, solvers.bal, solvers.colmap") == []


def test_a_device_solve_from_the_binary_cache_loads_nothing_heavy(tmp_path):
    """A BAL file read and solved with iterative_schur on the device, twice in fresh processes on
    one cache: the second neither renders (no Mako), nor touches the host reference (no scipy),
    nor shows a bar (no tqdm)."""
    path = tmp_path / "p.txt"
    code = f"""
        import solvers
        solvers.write_bal(solvers.synthetic_problem(10, 300, 3, seed=0), {str(path)!r})
        r = solvers.bundle_adjust(solvers.read_bal({str(path)!r}), linear_solver="iterative_schur",
                                  max_iterations=2, handle_sigint=False)
        assert r.state == "device", r.state
    """
    env = {"PYCLAD_CACHE_DIR": str(tmp_path / "cache")}
    _loaded(code, env)
    assert _loaded(code, env) == []


def test_a_general_solve_factorised_on_the_device_loads_no_scipy_linalg():
    """The general core on a device that factorises S itself (GPUs; forced here, as the CPU
    device factorises on the host) needs scipy.sparse, not scipy.linalg (0.03 s more to
    import)."""
    code = """
        import sys
        import solvers
        from solvers.general import pair_schur_device
        from test_solver_problem import scene, three_group_problem
        pair_schur_device.factors_on_device = lambda runtime: True
        r = solvers.solve(three_group_problem(scene(seed=3, n_images=6, n_cameras=1)), linear_solver="sparse_schur",
                          max_iterations=3, handle_sigint=False, device_resident=False)
        assert "dense Cholesky on " in r.linear_solver_detail and "LAPACK" not in r.linear_solver_detail, \\
            r.linear_solver_detail
        print("scipy.linalg loaded:", "scipy.linalg" in sys.modules)
    """
    script = textwrap.dedent(code)
    path = os.pathsep.join(p for p in (ROOT, os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")) if p)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=path))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "scipy.linalg loaded: False" in p.stdout, p.stdout
