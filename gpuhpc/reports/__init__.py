"""Report building blocks shared by the ledger, sweeps and efficiency reports (charts)."""
