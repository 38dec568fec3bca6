"""neuro-deploy: the CloudFormation stack that runs neuro on AWS, and the CLI that drives it."""
