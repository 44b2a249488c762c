"""``triosim plan``: enumerate the compositions of a model on N GPUs (candidates), weigh each
position of the trace once per key (profile), estimate every candidate's time and memory in
closed form (estimate, pipeline_time), DAG-time the best few and rank them (search), and show
and write the result (report, explain). A shell over the other layers: it may import them all."""

from .candidates import Candidate, SearchSpace, enumerate_candidates, mesh_shapes, strategy_has
from .estimate import Estimate, PlanSettings, estimate
from .explain import explain_empty, explain_infeasible
from .pareto import pareto_set
from .pipeline_time import PipelineTimer
from .profile import ModelProfile
from .report import Figures, csv_text, print_pareto, print_table, run_line, write_csv, write_plot
from .search import PlanOutcome, Row, search

__all__ = ["Candidate", "Estimate", "Figures", "ModelProfile", "PipelineTimer", "PlanOutcome", "PlanSettings", "Row",
           "SearchSpace", "csv_text", "enumerate_candidates", "estimate", "explain_empty", "explain_infeasible",
           "mesh_shapes", "pareto_set", "print_pareto", "print_table", "run_line", "search", "strategy_has", "write_csv", "write_plot"]
