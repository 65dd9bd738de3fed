"""Transform steps a connector runs every cycle: DuckDB SQL, Python functions and keyed event-time windows.

- ``operator``: the ``Operator`` protocol and its errors (config errors at start, runtime errors per cycle);
- ``sql``, ``functions``, ``windows``: the three kinds of step (window state is kept per source partition:
  ``WindowState`` is an ``engine.state.KeyedState``);
- ``chain``: runs the steps in order and times each one;
- ``database``: the process's one DuckDB database, a connection to it per user;
- ``repartition``: splitting a chain where rows must be re-keyed by the window key, and the rows' way
  through the repartition topic.

Which step a config line becomes is decided in ``engine.wiring``.
"""

from engine.transforms.chain import OperatorChain, build_chain
from engine.transforms.functions import PythonOperator, load_function
from engine.transforms.operator import Operator, OperatorConfigError, OperatorRuntimeError, Watermark
from engine.transforms.sql import SqlOperator
from engine.transforms.windows import END_OF_INPUT_WATERMARK, WindowOperator, WindowSpec, WindowState

__all__ = [
    "END_OF_INPUT_WATERMARK",
    "Operator",
    "OperatorChain",
    "OperatorConfigError",
    "OperatorRuntimeError",
    "PythonOperator",
    "SqlOperator",
    "Watermark",
    "WindowOperator",
    "WindowSpec",
    "WindowState",
    "build_chain",
    "load_function",
]
