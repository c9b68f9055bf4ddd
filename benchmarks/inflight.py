def p11(config):
    return []
