mod scanner;
