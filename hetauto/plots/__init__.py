"""Pictures of plans (`hetauto plan --plot plan.png`). Drawing only: it reads plans, specs and the cost model's
figures and never touches a device (import-linter: no runtime, backends or profiling). The Gantt chart of a
simulated iteration lives beside the simulator, in hetauto.schedule.gantt."""
