mod promote;
mod rollback;
