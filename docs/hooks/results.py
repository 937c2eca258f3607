"""MkDocs hook: publish the committed benchmark result files beside the pages.

The performance pages link every figure to the file under ``benchmarks/results/`` it comes
from. Those files live outside ``docs/``, so without this hook ``mkdocs build --strict`` would
reject the links. Each committed ``*.md``, ``*.json`` and ``*.log`` result is added as a static
file at ``results/<name>`` in the site, so a page links to it as ``../results/<name>``. They are
copied as they are (not rendered as pages): a result file is a record, not documentation.
"""
import os
import subprocess

from mkdocs.structure.files import File

SUFFIXES = (".md", ".json", ".log")


class ResultFile(File):
    """A result file served verbatim, even when its name ends in ``.md``."""

    def is_documentation_page(self):
        return False

    def is_static_page(self):
        return True


def _committed(root, folder):
    # Only what git tracks: a local, uncommitted run must not make a link pass here and fail in CI.
    try:
        out = subprocess.run(["git", "ls-files", "--", folder], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        return [os.path.basename(p) for p in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        # No git (an unpacked source archive): every file there counts.
        return sorted(os.listdir(os.path.join(root, folder)))


def on_files(files, config):
    root = os.path.dirname(os.path.abspath(config["config_file_path"]))
    folder = os.path.join("benchmarks", "results")
    for name in _committed(root, folder):
        if name.endswith(SUFFIXES):
            # src_dir is benchmarks/, so the file's path there, results/NAME, is its path in the site too.
            files.append(ResultFile(f"results/{name}", os.path.join(root, "benchmarks"), config["site_dir"],
                                    config["use_directory_urls"], dest_uri=f"results/{name}"))
    return files
