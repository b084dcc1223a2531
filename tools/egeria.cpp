// The egeria command line; tools/cli.cpp holds it.
#include "tools/cli.h"

int main(int argc, char** argv) { return eg::run_cli(argc, argv); }
