mod scanner;
mod store;
