"""The task-DAG engine: the TaskGraph (tasks, resources, edges as flat arrays), the network
settings it carries, the list scheduler (exclusive resources, or max-min fair flows on links) and
the invariants of a DAG and a schedule. It knows tasks, resources and time, never parallelism."""
