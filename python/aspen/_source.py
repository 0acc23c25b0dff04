"""What every kind of model the package takes becomes (an ONNX file, a Hugging Face directory, a torch
module, a Keras model): the defaults suit a source with no host model behind it."""


class Source:
    input_names = ()   # the call's inputs, in order
    output_names = ()  # the program's outputs the call returns, in order

    def optional_inputs(self):
        """Inputs a call may leave out."""
        return set()

    def describe(self):
        """What the user gave, as errors name it instead of the temporary file it was exported to (None: the
        file is the user's own)."""
        return None

    def naming_errors(self, path):
        """A context in which an error about the file at `path` names what the user gave instead (each node
        also names its layer and source line: NOTE [node origins] in io/onnx.cc)."""
        import contextlib
        what = self.describe()
        if what is None:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def renamed():
            try:
                yield
            except (ValueError, NotImplementedError, RuntimeError) as e:
                text = str(e).replace(path, what)
                if text == str(e):
                    raise
                raise type(e)(text) from None
        return renamed()

    def static_argument(self, name, value):
        """True when `value`, given for input `name`, is a setting the program is compiled with (a Python
        bool, None, str or number passed to forward as it is), not an array fed at run time."""
        return False

    def check_parameters(self, params):
        """Refuses, naming it, an optimizer's `params` entry that is not a parameter of the model."""

    def resolve_options(self, options):
        """The program's options (the dict Options._resolved gives) as this source needs them."""
        return options

    def cut(self, begins):
        """Options.setPipelineStages: the training dict's additions (python/module.cc training_from) that cut the
        program into stages beginning at `begins`; a source that cannot be cut so raises, naming itself."""
        raise NotImplementedError(f"setPipelineStages: {self.describe() or 'this model'} cannot be cut by names "
                                  "(an ONNX file by node-name prefixes, a Keras model by layer names; a torch "
                                  "module by aspen.poptorch's Block / BeginBlock)")

    def feeds(self, arrays):
        """The program's inputs from the call's arrays."""
        return arrays

    def loss_output(self):
        """The output that is the model's own loss, or None."""
        return None

    def compiled_loss(self):
        """The loss kind the framework model was compiled with ("cross_entropy", "mse"), or None."""
        return None

    def outputs(self, values, framework):
        """The call's result from the program's outputs by name: in output order, torch tensors for torch
        inputs, one value alone."""
        out = tuple(values[n] for n in self.output_names)
        if framework == "torch":
            import torch
            out = tuple(torch.from_numpy(v) for v in out)
        return out[0] if len(out) == 1 else out

    def copy_to_host(self, weights):
        """The device's weights (by the program's names) into the host model."""

    def host_weights(self):
        """The host model's weights by the program's names."""
        return {}

    def close(self):
        """Frees what the source made (an exported file)."""
