"""Getting ranks onto machines: the launch plan (`hetauto.launch/1`), launch targets as plugins (torchrun, slurm,
kubernetes, skypilot), the local and network-namespace launchers, and the lead side of the control plane
(collect, diagnose, report). `hetauto.runtime` (what runs inside a rank) never imports this package."""
