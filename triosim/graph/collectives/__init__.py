"""Collective communication: closed-form costs, the algorithm choice, and task-DAG fragments.

Closed forms (no task graph): :mod:`.groups` and :mod:`.protocols` (the group's shape, NCCL's
latencies and protocol shares), :mod:`.phases` (what a plan is made of), one module per
algorithm family (:mod:`.ring_cost`, :mod:`.direct_cost`, :mod:`.hierarchical_cost`,
:mod:`.nvls_cost`, :mod:`.tree_cost` over the pipeline of :mod:`.double_tree`), :mod:`.plans` (any algorithm's
phases), :mod:`.choice` (``auto``) and :mod:`.cost` (``collective_cost``).

Task-DAG fragments: :mod:`.fragment` (what every fragment shares), one builder per algorithm
(:mod:`.ring_tasks`, :mod:`.direct_tasks`, :mod:`.hierarchical_tasks`, :mod:`.tree_tasks`,
:mod:`.nvls_tasks`) and
:mod:`.algorithms` (``add_all_reduce`` and the other entry points). :mod:`.group_comm` adds a
hybrid run's collectives exactly or for one representative; :mod:`.star_routes` knows the
routes of star-like topologies in closed form.
"""
