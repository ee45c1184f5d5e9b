"""The version of jaxmesh, written once.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), so the installed
package's metadata says the same. ``jaxmesh.__version__``, the client's
handshake, the server's reply and the HTML report import it from here: this
module imports nothing, so the JAX-free server and the client never load the
package root (which imports JAX).
"""

__version__ = "0.1.0"
