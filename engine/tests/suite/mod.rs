mod rollback;
