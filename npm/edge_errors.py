"""The gist of an error raised by a library at the edges: the JVM of pyserini / Lucene (``jnius.JavaException``),
FAISS (a ``RuntimeError`` carrying the C++ location) and safetensors (``SafetensorError``).

Each function recognises its library's exception by type name and message only, so nothing here imports those
libraries (``npm-repro --help`` stays light), and returns one line, or None for any other exception. The CLI prefixes
the library's name (``npm.cli.edge_error``); the readers of the indexes wrap the gist in a message naming the file
(``npm.datastore.bm25``, ``npm.datastore.faiss_index``).
"""

from __future__ import annotations

import re

# FAISS's C++ exceptions reach Python as RuntimeError("Error in <function> at <file>:<line>: <message>").
_FAISS_ERROR = re.compile(r"Error in (?P<where>.*?) at (?P<file>\S+?):(?P<line>\d+): ", re.S)
_JAVA_PREFIX = "JVM exception occurred: "
MAX_GIST = 300  # characters: a Java message can hold a whole file listing


def first_line(text) -> str:
    """The first non-blank line of ``text`` (any object, through ``str``), stripped; "" when there is none."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def raised_by(exc: BaseException, modules: set[str], name: str) -> bool:
    """Whether ``exc`` is (a subclass of) the class ``name`` defined in one of ``modules``, checked by name so that
    the library is never imported here."""
    return any(c.__name__ == name and c.__module__ in modules for c in type(exc).__mro__)


def _short(text: str) -> str:
    return text if len(text) <= MAX_GIST else text[:MAX_GIST - 3] + "..."


def java_gist(exc: BaseException) -> str | None:
    """``CLASS: first line of its message`` of a Java exception crossing pyjnius (``CLASS`` alone when it has no
    message; pyjnius's own errors, a missing class or method, carry no Java class: their first line)."""
    if not raised_by(exc, {"jnius"}, "JavaException"):
        return None
    classname, message = getattr(exc, "classname", None), getattr(exc, "innermessage", None)
    if not classname:
        return _short(first_line(str(exc).removeprefix(_JAVA_PREFIX)) or type(exc).__name__)
    gist = first_line(message) if message else ""
    return _short(f"{classname}: {gist}" if gist else classname)


def faiss_gist(exc: BaseException) -> str | None:
    """The message of a FAISS C++ exception without its source location (the first line after it)."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    m = _FAISS_ERROR.match(text)
    if not m or "faiss" not in (m["where"] + m["file"]).lower():
        return None
    return first_line(text[m.end():]) or first_line(text)


def safetensors_gist(exc: BaseException) -> str | None:
    """The first line of a safetensors error (a truncated or foreign weights file)."""
    if not raised_by(exc, {"safetensors", "safetensors_rust", "safetensors._safetensors_rust"}, "SafetensorError"):
        return None
    return first_line(exc) or type(exc).__name__
