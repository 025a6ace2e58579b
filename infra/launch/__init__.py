"""Where the work runs: DeepSpeed's launcher starts the training ranks on one node or a hostfile's, Ray the data stages."""
