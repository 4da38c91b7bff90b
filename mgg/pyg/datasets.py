"""``torch_geometric.datasets``' Planetoid over mgg's dataset files: this rank's share."""

from __future__ import annotations

import os
from pathlib import Path

from .data import Data, load


class Planetoid:
    """Cora, CiteSeer or PubMed with the public split, from ``<name>.npz`` (mgg's format:
    ../shared/data/MANIFEST.md) in ``root``, in ``root``'s parent, or in $MGG_DATA.
    ``dataset[0]`` is this rank's Data, made with ``dataset.transform`` (set at
    construction or after, as PyG's benchmarks do); ``num_features``, ``num_classes`` the
    whole's.
    ``kw``: mgg.pyg.load's (knobs such as ``split=``, how nodes are cut into ranks)."""

    def __init__(self, root, name: str, transform=None, **kw):
        file = f"{name.lower()}.npz"
        places = [Path(root), Path(root) / file, Path(root).parent / file]
        if os.environ.get("MGG_DATA"):
            places.append(Path(os.environ["MGG_DATA"]) / file)
        path = next((p for p in places if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"Planetoid: no {file} in {root} or its parent (or $MGG_DATA): mgg reads "
                "its .npz datasets (`mgg convert` makes them); it downloads nothing"
            )
        self.name, self.path, self.transform, self._kw = name, path, transform, kw
        self._data, self._made_with = None, None

    @property
    def data(self) -> Data:
        """This rank's Data, loaded (collectively) on first use with ``self.transform``,
        and again when the transform was replaced (PyG applies it at each access)."""
        if self._data is None or self._made_with is not self.transform:
            self._data = load(self.path, transform=self.transform, **self._kw)
            self._made_with = self.transform
        return self._data

    @property
    def num_features(self) -> int:
        return self.data.num_features

    @property
    def num_classes(self) -> int:
        return self.data.num_classes

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> Data:
        if i not in (0, -1):
            raise IndexError(f"{self.name} holds one graph, got index {i}")
        return self.data

    def to(self, *args, **kwargs):
        return self

    def __repr__(self) -> str:
        return f"{self.name}()"


__all__ = ["Planetoid"]
