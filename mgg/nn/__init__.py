"""Layers with explicit forward/backward over the distributed aggregation (a
mgg.distgraph.DistGraph), models, loss and optimizers."""

from .layers import Dropout, GCNConv, GINConv, Linear, Module, Parameter, ReLU
from .loss import accuracy, softmax_cross_entropy
from .models import GCN, GIN, MODELS, Sequential
from .optim import OPTIMIZERS, SGD, Adam

__all__ = [
    "Module",
    "Parameter",
    "Linear",
    "ReLU",
    "Dropout",
    "GCNConv",
    "GINConv",
    "Sequential",
    "GCN",
    "GIN",
    "MODELS",
    "softmax_cross_entropy",
    "accuracy",
    "Adam",
    "SGD",
    "OPTIMIZERS",
]
