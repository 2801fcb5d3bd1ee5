from examples.langgraph_nodes.graph import main

main()
