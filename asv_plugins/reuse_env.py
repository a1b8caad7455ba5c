"""asv environment type ``reuse``: per-commit venvs layered on an existing interpreter.

Why: on GPU machines torch is preinstalled and there is often no package
index, so asv's ``virtualenv``/``uv`` types (which pip-install requirements)
fail, while ``existing`` cannot check out and build other commits
(no ``asv run A..B`` / ``continuous`` / ``find``).

Each environment is a fresh ``<base> -m venv --without-pip`` whose
site-packages holds a ``.pth`` file that adds the base interpreter's
site-packages (torch, pip, setuptools, asv_runner, ...).  Nothing is ever
downloaded: the project is built/installed per commit by asv's normal
build/install commands, which must be configured offline (below).

Base interpreter: ``$VERIFY_ATTN_BASE_PYTHON`` (a path) if set, else the
interpreter running asv.  ``--system-site-packages`` is not used because the
base may itself be a venv (e.g. /opt/torch/.venv/bin/python3), whose packages
a nested venv would not see.

Wiring (asv.conf.json, asv run from the directory holding it)::

    "environment_type": "reuse",
    "plugins": [".asv_plugins.reuse_env"],
    "pythons": ["base"],
    "matrix": {},
    "build_command": ["python -m pip wheel --no-deps --no-build-isolation --no-index -w {build_cache_dir} {build_dir}"],
    "install_command": ["in-dir={env_dir} python -m pip install --no-deps --no-index --force-reinstall {wheel_file}"],
    "uninstall_command": ["return-code=any python -m pip uninstall -y {project}"],

Importing this module also makes asv's JSON writes atomic (see bottom).
"""

import json
import os
import stat
import sys
import tempfile

from asv import environment, util
from asv.console import log

BASE_PYTHON_ENV_VAR = "VERIFY_ATTN_BASE_PYTHON"

# Run inside the base interpreter: its version and every site dir it uses.
# site.getsitepackages() covers venv + system dirs (and Debian dist-packages);
# purelib/platlib are added in case a distro patches one of them differently.
_PROBE = r"""
import importlib.util, json, os, site, sys, sysconfig
dirs = []
for d in site.getsitepackages() + [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]:
    if d and os.path.isdir(d) and d not in dirs:
        dirs.append(d)
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2],
    "site_dirs": dirs,
    "missing": [m for m in ("pip", "asv_runner") if importlib.util.find_spec(m) is None],
}))
"""

_probe_cache = {}


def base_python():
    """Path of the interpreter whose packages every ``reuse`` env sees."""
    path = os.environ.get(BASE_PYTHON_ENV_VAR) or sys.executable
    # abspath, not realpath: resolving a venv's python symlink would lose the venv.
    path = os.path.abspath(os.path.expanduser(path))
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise util.UserError(
            f"reuse env: base interpreter {path!r} does not exist or is not executable "
            f"(set {BASE_PYTHON_ENV_VAR} to a python path, or unset it to use {sys.executable})"
        )
    return path


def probe_base(path):
    if path not in _probe_cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        try:
            out = util.check_output([path, "-I", "-c", _PROBE], env=env, display_error=False)
            _probe_cache[path] = json.loads(out)
        except (util.ProcessError, OSError, ValueError) as exc:
            raise util.UserError(f"reuse env: cannot query base interpreter {path!r}: {exc}")
    return _probe_cache[path]


class Reuse(environment.Environment):
    """A venv per asv environment, seeing the base interpreter's site-packages."""

    tool_name = "reuse"

    def __init__(self, conf, python, requirements, tagged_env_vars):
        if requirements:
            # Installing anything would need an index; everything must come from the base.
            raise util.UserError(
                f"reuse env: the requirement matrix must be empty, got {requirements!r}"
            )
        self._base_python = base_python()
        self._base = probe_base(self._base_python)
        if "pip" in self._base["missing"]:
            raise util.UserError(
                f"reuse env: base interpreter {self._base_python} cannot import pip, "
                "which the build/install commands run as `python -m pip`"
            )
        version = self._base["version"]
        # "pythons" entries only select; the env always runs the base's version.
        if python not in ("base", "same", version):
            raise util.UserError(
                f"reuse env: pythons entry {python!r} does not match base interpreter "
                f"{self._base_python} (Python {version}); use \"pythons\": [\"base\"]"
            )
        self._requirements = {}  # Environment.__init__ reads it (dir_name) before setting it
        super().__init__(conf, version, {}, tagged_env_vars)
        # asv would otherwise want pip/build/asv_runner/pympler + pyproject build deps.
        self._base_requirements = {}

    @classmethod
    def matches(cls, python):
        # Any spec is accepted here; __init__ validates it with a clear error.
        return True

    def _marker(self):
        return {"base_python": self._base_python, "site_dirs": self._base["site_dirs"]}

    def _marker_path(self):
        return os.path.join(self._path, "asv-reuse-base.json")

    def check_presence(self):
        # Rebuild when the base interpreter (hence the .pth contents) changed.
        if not super().check_presence():
            return False
        try:
            return util.load_json(self._marker_path()) == self._marker()
        except (util.UserError, OSError):
            return False

    def _setup(self):
        log.info(f"Creating venv for {self.name} on top of {self._base_python}")
        # --without-pip: no ensurepip needed (often absent on distro pythons); pip
        # comes from the base via the .pth.
        util.check_call([self._base_python, "-m", "venv", "--without-pip", self._path])
        site_dir = self.run_executable(
            "python", ["-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).strip()

        # addsitedir (not bare path lines) so the base's own .pth files are honoured too;
        # appended after the env's site-packages, so the per-commit project wins.
        lines = [f"import site; site.addsitedir({d!r})" for d in self._base["site_dirs"]]
        if "asv_runner" in self._base["missing"]:
            # The benchmark runner needs asv_runner; reuse the one of the running asv.
            import asv_runner

            shim = os.path.join(self._path, "asv-runner-shim")
            os.makedirs(shim)
            os.symlink(os.path.dirname(asv_runner.__file__), os.path.join(shim, "asv_runner"))
            lines.append(shim)
        with open(os.path.join(site_dir, "_asv_reuse_base.pth"), "w") as f:
            f.write("\n".join(lines) + "\n")

        # asv's check_presence() requires bin/pip; forward it to the base's pip.
        pip = os.path.join(self._path, "bin", "pip")
        with open(pip, "w") as f:
            f.write('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
        os.chmod(pip, os.stat(pip).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

        util.write_json(self._marker_path(), self._marker())

    def run(self, args, **kwargs):
        log.debug(f"Running '{' '.join(args)}' in {self.name}")
        return self.run_executable("python", args, **kwargs)


# asv's util.write_json truncates the target and then dumps into it, so an
# interrupt (Ctrl-C, OOM kill, full disk) mid-write leaves a corrupt results
# file.  Write to a temp file in the same directory and os.replace() it instead.
# Every asv writer (results, benchmarks.json, machine.json) calls util.write_json.
def _atomic_write_json(path, data, api_version=None, compact=False):
    path = os.path.abspath(path)
    dirname = os.path.dirname(path)
    os.makedirs(dirname, exist_ok=True)
    if api_version is not None:
        data = dict(data)
        data["version"] = api_version
    # ".tmp" suffix: asv only loads *.json from results dirs.
    fd, tmp = tempfile.mkstemp(prefix=".asv-", suffix=".tmp", dir=dirname)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if compact:
                json.dump(data, f)
            else:
                json.dump(data, f, indent=4, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; keep asv's usual permissions
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


util.write_json = _atomic_write_json
