"""Trained policies shipped with jaxmesh (weights inside the package)."""

from jaxmesh.zoo.cartpole import CartPoleMLP

__all__ = ["CartPoleMLP"]
