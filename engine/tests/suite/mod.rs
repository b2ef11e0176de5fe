mod policy;
mod rollback;
mod scanner;
mod store;
