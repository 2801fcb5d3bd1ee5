from examples.langgraph_agent.agent import main

main()
