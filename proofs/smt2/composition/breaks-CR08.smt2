; placement-logic proof obligation: composition/breaks-CR08
; theorem: Composition
; breaking CR08 tied-weights-stages is refuted
;   statement refuted: Tied weights that live on two pipeline stages get their gradients summed across them.  [plan: tied embedding gradient summed twice across the stages]
; the assertions are the NEGATION of the statement:
;   expected sat (witness exists)
(set-logic ALL)
(set-info :status sat)
(declare-fun size_x () Int)
(declare-fun size_y () Int)
(declare-fun size_microbatches () Int)
(assert
 (>= size_x 1))
(assert
 (<= size_x 2))
(assert
 (>= size_y 1))
(assert
 (<= size_y 2))
(assert
 (>= size_microbatches 1))
(assert
 (<= size_microbatches 2))
(assert
 (let (($x0 (>= size_y 2)))
(let (($x1 (and $x0 true)))
(or $x1))))
(check-sat)
(exit)
