"""Type stub of asyncckpt._version, which CMake writes into the build tree's package (and
`pip install` into the installed one) from project(VERSION)."""

__version__: str
