mod self_validation;
