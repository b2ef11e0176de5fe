mod policy;
mod scanner;
mod store;
