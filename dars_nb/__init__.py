__version__ = "0.0.1"

import importlib as _importlib, importlib.abc as _abc, importlib.util as _util, sys as _sys, types as _types, warnings as _warnings

# Modules that moved into the packages of their chapters. For one release the old names still import, with a
# DeprecationWarning: a stand-in module that finds each name in the modules now holding it, in this order.
MOVED_MODULES = {
    'datasets': ('sources.datasets',), 'importers': ('sources.importers',),
    'release': ('sources.release', 'sources.release_writer', 'sources', 'observations'),
    'encoder': ('features.encoder',), 'embedding_store': ('features.embedding_store',), 'cache': ('features.cache',),
    'bootstrap': ('evaluate.bootstrap',), 'curves': ('evaluate.curves',), 'draws': ('evaluate.draws',),
    'bundle_format': ('bundle.format',), 'guard': ('bundle.guard',), 'bundle_state': ('bundle.state',),
    'training': ('bundle.training',), 'calibrate': ('bundle.calibrate', 'bundle.model_name'),
    'litellm_router': ('bundle.litellm',), 'collect.local': ('pool.local',), 'cache_folder': ('files.cache_folder',),
}

class _MovedModuleFinder(_abc.MetaPathFinder, _abc.Loader):
    "Imports an old module name as a stand-in that reads its names from the modules that hold them now."
    def find_spec(self, name, path=None, target=None):
        old = name.removeprefix('dars_nb.')
        return _util.spec_from_loader(name, self) if name.startswith('dars_nb.') and old in MOVED_MODULES else None

    def create_module(self, spec):
        homes = ['dars_nb.' + m for m in MOVED_MODULES[spec.name.removeprefix('dars_nb.')]]
        _warnings.warn(f"{spec.name} has moved to {homes[0]}; the old name will be removed in the next release",
                       DeprecationWarning, stacklevel=2)
        module = _types.ModuleType(spec.name, f"Moved: see {', '.join(homes)}.")
        def __getattr__(attr, homes=homes):
            for home in homes:
                mod = _importlib.import_module(home)
                if hasattr(mod, attr): return getattr(mod, attr)
            raise AttributeError(f"module {spec.name!r} (moved to {homes[0]}) has no attribute {attr!r}")
        module.__getattr__ = __getattr__
        module.__all__ = sorted({n for h in homes for n in getattr(_importlib.import_module(h), '__all__', ())})
        return module

    def exec_module(self, module): pass

if not any(isinstance(f, _MovedModuleFinder) for f in _sys.meta_path): _sys.meta_path.insert(0, _MovedModuleFinder())
