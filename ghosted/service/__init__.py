"""The app's service: its typed requests and results, the job queue, the result store, deployments."""
