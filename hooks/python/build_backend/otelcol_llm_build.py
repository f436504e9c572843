"""The package's build backend (PEP 517, PEP 660), standard library only.

``pip install ./hooks/python`` must work where vLLM runs, offline included, with whatever pip and Python are
there. setuptools older than 70.1 (Debian 12 ships 66) cannot build a wheel without the separate ``wheel``
package, so the package builds itself: its wheel is two modules, their metadata and the vLLM entry point. The
package's metadata is here, in one place; pyproject.toml names this backend.
"""

import base64
import hashlib
import io
import os
import tarfile
import time
import zipfile

NAME = "otelcol-llm-hook"
VERSION = "0.1.0"
SUMMARY = ("Token events from an LLM engine to otelcol-llm's token_stream receiver, and a vLLM plugin that "
           "sends them")
REQUIRES_PYTHON = ">=3.9"
LICENSE = "Apache-2.0"
MODULES = ("otelcol_llm_hook.py", "otelcol_llm_vllm.py", "otelcol_llm_vllm_patching.py", "otelcol_llm_vllm_steps.py")
# vLLM loads the functions of this group in each of its processes (vllm/plugins/__init__.py).
ENTRY_POINTS = "[vllm.general_plugins]\notelcol_llm = otelcol_llm_vllm:register\n"

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIST = NAME.replace("-", "_")
_INFO = "%s-%s.dist-info" % (_DIST, VERSION)
_TAG = "py3-none-any"


def _metadata():
    with open(os.path.join(_HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nLicense: %s\nRequires-Python: %s\n"
            "Description-Content-Type: text/markdown\n\n%s" % (NAME, VERSION, SUMMARY, LICENSE, REQUIRES_PYTHON,
                                                                readme))


def _dist_info_files():
    return [
        (_INFO + "/METADATA", _metadata().encode("utf-8")),
        (_INFO + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: otelcol_llm_build %s\nRoot-Is-Purelib: true\n"
                            "Tag: %s\n" % (VERSION, _TAG)).encode()),
        (_INFO + "/entry_points.txt", ENTRY_POINTS.encode()),
    ]


def _write_wheel(directory, files):
    """A wheel of files ([(archive name, bytes)]) with its RECORD; returns its basename."""
    name = "%s-%s-%s.whl" % (_DIST, VERSION, _TAG)
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in files:
            whl.writestr(_zipinfo(arcname), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))
        record.append(_INFO + "/RECORD,,")
        whl.writestr(_zipinfo(_INFO + "/RECORD"), "\n".join(record) + "\n")
    return name


def _zipinfo(arcname):
    # A fixed date: the same sources build the same wheel.
    info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def _read(name):
    with open(os.path.join(_HERE, name), "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(m, _read(m)) for m in MODULES] + _dist_info_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # An editable install puts this folder on sys.path through a .pth file.
    return _write_wheel(wheel_directory, [(_DIST + ".pth", (_HERE + "\n").encode())] + _dist_info_files())


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (_DIST, VERSION)
    name = base + ".tar.gz"
    files = list(MODULES) + ["README.md", "pyproject.toml", "build_backend/otelcol_llm_build.py"]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            _add(tar, base + "/" + f, _read(f))
        _add(tar, base + "/PKG-INFO", _metadata().encode("utf-8"))
    return name


def _add(tar, arcname, data):
    info = tarfile.TarInfo(arcname)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.mktime((2020, 1, 1, 0, 0, 0, 0, 0, -1)))
    tar.addfile(info, io.BytesIO(data))
