"""Index spaces, arrays and views (SPEC §1)."""
from hetflow.index.arrays import asarray, empty, is_device_array, zeros
from hetflow.index.lowering import Lowering, lowering
from hetflow.index.space import Grid, extent, index
from hetflow.index.tiling import Partition, Tile, partition, tile
from hetflow.index.operators import (CoMap, CShift, Interior, Project, Section, Transpose,
                                     co_map, cshift, interior, project, section, transpose)
from hetflow.index.views import View, extent_of, is_view, rank, root_of

__all__ = [
    "Grid", "extent", "index",
    "asarray", "empty", "zeros", "is_device_array",
    "View", "CoMap", "Project", "CShift", "Interior", "Transpose", "Section", "Tile",
    "Partition", "co_map", "project", "cshift", "interior", "transpose", "section", "tile",
    "partition", "rank", "extent_of", "root_of", "is_view",
    "Lowering", "lowering",
]
