"""The documentation holds together: the examples run, the README opens with its two commands,
the API reference lists each package's public names, every figure's result file is committed,
the performance tables are what benchmarks/plots.py makes of the result files, and the site
builds with ``mkdocs build --strict`` (where MkDocs is installed; CI installs it)."""
import glob
import importlib
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# Each example with arguments that keep it small (seconds on a 2-core CPU), and a line its output
# must hold. An example missing here fails test_every_example_has_a_small_run.
EXAMPLES = {
    "ad_quickstart.py": (["--tuples", "2000"], "2000 tuples in"),
    "bundle_adjust_bal.py": (["--synthetic", "10,300,3", "-q"], "Termination:"),
    "colmap_bundle_adjust.py": (["--frames", "8", "--points", "200"], "with centre priors:"),
    "colmap_rig.py": (["--cameras", "2", "--frames", "4"], "mean reprojection error"),
}
NEEDS_PYCOLMAP = {"colmap_bundle_adjust.py", "colmap_rig.py"}


def _examples():
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py")))


def _doc_pages():
    return [p for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)
            if os.sep + "snippets" + os.sep not in p]


def test_every_example_has_a_small_run():
    assert _examples(), "no examples found"
    assert set(_examples()) == set(EXAMPLES), "give each example a small run in EXAMPLES"


@pytest.mark.parametrize("name", _examples())
def test_example_runs_with_small_inputs(name, tmp_path):
    if name in NEEDS_PYCOLMAP:
        pytest.importorskip("pycolmap", reason=f"{name} makes its reconstruction with pycolmap")
    args, expect = EXAMPLES[name]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-W", "ignore", os.path.join(ROOT, "examples", name), *args],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert expect in run.stdout, run.stdout[-2000:]


def test_every_example_is_included_in_the_docs():
    text = "".join(open(p).read() for p in _doc_pages())
    missing = [n for n in _examples() if f'--8<-- "examples/{n}"' not in text]
    assert not missing, f"include these in a guide with --8<--: {missing}"


def test_readmes_first_code_block_is_the_two_commands():
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"```[a-z]*\n(.*?)```", f.read(), re.S).group(1)
    assert block.strip().splitlines() == ['pip install . && python -m solvers.bal',
                                          'pip install ".[test]" && python -m pytest -q tests']


def _reference_names(page, package):
    """The names a reference page documents: its member list, the ``::: package.x.name``
    directives of names that share a module's name, and the constants written on the page."""
    with open(os.path.join(DOCS, "reference", page)) as f:
        text = f.read()
    members = re.findall(r"^ {8}- (\w+)$", text, re.M)
    direct = [d.rsplit(".", 1)[1].rstrip("_") for d in re.findall(rf"^::: ({package}\.[\w.]+)$", text, re.M)]
    linked = re.findall(rf"`{package}\.(\w+)` is\s+\[", text)
    written = re.findall(r"^### `(\w+)`$", text, re.M)
    return members + direct + linked + written


@pytest.mark.parametrize("package", ["clkernels", "pyclad", "solvers"])
def test_the_reference_lists_exactly_the_public_names(package):
    names = _reference_names(f"{package}.md", package)
    public = importlib.import_module(package).__all__
    assert len(names) == len(set(names)), f"listed twice: {sorted(n for n in names if names.count(n) > 1)}"
    assert set(names) == set(public), (f"missing: {sorted(set(public) - set(names))}, "
                                       f"not public: {sorted(set(names) - set(public))}")


def _committed_results():
    out = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout: which result files are committed is unknown")
    return {os.path.basename(p) for p in out.stdout.split()}


def test_every_linked_result_file_is_committed():
    committed = _committed_results()
    pages = _doc_pages() + glob.glob(os.path.join(DOCS, "snippets", "**", "*.md"), recursive=True)
    linked = {m for p in pages for m in re.findall(r"\]\(\.\./results/([^)#]+)\)", open(p).read())}
    assert linked, "no page links a result file"
    assert not linked - committed, f"linked but not committed: {sorted(linked - committed)}"


def test_every_performance_page_links_its_results():
    for page in glob.glob(os.path.join(DOCS, "performance", "*.md")):
        text = open(page).read()
        if os.path.basename(page) == "index.md":
            continue
        assert "](../results/" in text or "docs/snippets/perf/" in text, f"{page} links no result file"


def test_the_performance_tables_are_what_the_results_give(tmp_path):
    # A table edited by hand, or a result file changed without rerunning the script, fails here.
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        plots = importlib.import_module("plots")
        assert plots.main(["--no-plots", "--no-readme", "--tables", str(tmp_path)]) == 0
        markers = plots.README_MARKERS
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    committed = os.path.join(DOCS, "snippets", "perf")
    assert sorted(os.listdir(tmp_path)) == sorted(os.listdir(committed))
    for name in os.listdir(tmp_path):
        with open(tmp_path / name) as made, open(os.path.join(committed, name)) as kept:
            assert made.read() == kept.read(), f"docs/snippets/perf/{name} differs: run python benchmarks/plots.py"
    # The README's headline table is the same figures, written by the same script.
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    between = readme[readme.index(markers[0]) + len(markers[0]):readme.index(markers[1])]
    with open(tmp_path / "readme_headline.md") as f:
        assert between.strip() == f.read().strip(), "README.md's headline table differs: run python benchmarks/plots.py"


def test_every_plot_a_page_shows_exists():
    shown = {m for p in _doc_pages() for m in re.findall(r"\(\.\./assets/plots/([\w.-]+\.png)\)", open(p).read())}
    assert shown
    assert all(os.path.exists(os.path.join(DOCS, "assets", "plots", n)) for n in shown)


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="MkDocs is not installed (pip install '.[docs]'); CI builds the site")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings is not installed (pip install '.[docs]')")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert (site / "reference" / "solvers.html").exists()
    assert (site / "results" / "bench_bundle_adjust-pocl-zen5.md").exists()
    html = (site / "performance" / "bundle-adjustment.html").read_text()
    assert "../assets/plots/ba_time_per_problem.png" in html and "../results/" in html
