"""What the footprint model needs of a dataset (mgg.footprint): its sizes and kinds, from
a Dataset, a sharded dataset's manifest, or a spec's counts alone."""

from __future__ import annotations


def facts(n: int, e: int, *, features: int = 0, classes: int = 0, **rest) -> dict:
    """What the estimate needs of a graph of ``n`` nodes and ``e`` CSR entries (dense
    features, one class per node, undirected, stored float32, not sharded, every row
    labeled, without edge weights of its own, unless ``rest`` says otherwise: symmetric,
    feature_nnz, stored, multilabel, makes_split, sharded, labeled, weighted, name)."""
    out = {"n": int(n), "e": int(e), "features": int(features), "classes": int(classes)}
    out.update(symmetric=True, feature_nnz=None, featureless=not features, stored="float32")
    out["weighted"] = False
    out.update(multilabel=False, makes_split=False, sharded=False, labeled=None)
    out.update(rest)
    return out


def split_rows(masks) -> int | None:
    """Rows in any of the split ``masks`` (bool [n] each, or None); None without one: every
    row counts, as when the job makes the split."""
    masks = [m for m in masks or () if m is not None]
    if not masks:
        return None
    out = masks[0].copy()
    for m in masks[1:]:
        out |= m
    return int(out.sum())


def job_facts(ds) -> dict:
    """What the estimate needs of ``ds`` (a Dataset, a ShardedDataset's manifest, or these
    facts already: :func:`facts`)."""
    if isinstance(ds, dict):
        return ds
    graph = getattr(ds, "graph", None)
    if graph is None:  # sharded: the manifest's facts
        return facts(
            ds.num_nodes,
            ds.num_edges,
            features=ds.num_features or 0,
            classes=ds.num_classes or 0,
            symmetric=bool(ds.symmetric),
            feature_nnz=0 if ds.features == "sparse" else None,
            featureless=ds.features is None,
            stored=ds.manifest.get("feature_dtype") or "float32",
            sharded=True,
            labeled=ds.manifest.get("labeled"),
            weighted="norm" not in ds.manifest["files"][0],  # its plans' weights don't factor
        )
    x = ds.x
    return facts(
        graph.num_nodes,
        graph.num_edges,
        features=0 if x is None else int(x.shape[1]),
        classes=ds.num_classes or 0,
        symmetric=bool(graph.symmetric),
        feature_nnz=int(x.nnz) if hasattr(x, "nnz") else None,
        multilabel=bool(ds.multilabel),
        makes_split=ds.y is not None and ds.train_mask is None,
        labeled=split_rows((ds.train_mask, ds.val_mask, ds.test_mask)),
        weighted=graph.weights is not None,
    )
